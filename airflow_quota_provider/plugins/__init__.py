"""REST API, UI page (and their data models) of the quota provider, mounted at ``/quota``."""

URL_PREFIX = "/quota"
