"""REST API, UI page (and their data models) of the quota provider, mounted at ``/quota``."""

URL_PREFIX = "/quota"


def base_url() -> str:
    """Where the Airflow UI is served (``[api] base_url``, without its trailing slash); empty when
    unset, and links are then relative to the api-server's root."""
    from airflow.configuration import conf

    return conf.get("api", "base_url", fallback="").rstrip("/")
