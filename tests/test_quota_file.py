"""Reading the quota file: every reader gets the same error naming the setting, the path or the bad field."""

from __future__ import annotations

import pytest

from airflow_quota_provider.quota_file import QuotaConfigError, read_quota_file


def test_an_unset_path_names_the_setting():
    with pytest.raises(QuotaConfigError, match=r"^\[quota\] quota_file: not set"):
        read_quota_file("")


def test_a_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "quotas.yaml"
    with pytest.raises(QuotaConfigError, match=rf"^{missing}: .*cannot read the quota file"):
        read_quota_file(str(missing))


def test_a_bad_field_is_named_with_the_path(tmp_path):
    path = tmp_path / "quotas.yaml"
    path.write_text("queues:\n- name: q\n  capacity: 4\n  quotas:\n  - {name: a, capacity: 4, sharing: bogus}\n")
    with pytest.raises(QuotaConfigError, match=rf"^{path}: queues\[0\]\.quotas\[0\]\.sharing: 'bogus'"):
        read_quota_file(str(path))


def test_a_good_file_is_read(tmp_path):
    path = tmp_path / "quotas.yaml"
    path.write_text("queues:\n- name: q\n  capacity: 4\n  quotas:\n  - {name: a, capacity: 4}\n")
    assert [q.name for q in read_quota_file(str(path)).queues] == ["q"]
