"""The plugin is registered once: Airflow loads it, and reports no import error, whether providers are
discovered lazily (the default) or eagerly (``[core] lazy_discover_providers = False``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

LOAD_PLUGINS = """
import json
from airflow import plugins_manager
plugins, errors = plugins_manager._get_plugins()
print(json.dumps({"names": [p.name for p in plugins], "errors": errors}))
"""


@pytest.mark.parametrize("lazy", ["True", "False"])
def test_airflow_loads_the_plugin_once_without_an_import_error(tmp_path, lazy):
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": lazy,
    }
    # cwd outside the checkout: its build leftovers (an .egg-info) would be a second distribution.
    result = subprocess.run(
        [sys.executable, "-c", LOAD_PLUGINS], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-4000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded["names"].count("quota") == 1
    assert loaded["errors"] == {}
