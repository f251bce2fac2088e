"""The outbox's URL for a Django database (``outbox.contrib.django.conf.url_for``), which
``manage.py outbox_migrate`` migrates and ``outbox worker`` is given: the same file or server and
database Django connects to, or a refusal that says what to give instead."""

from __future__ import annotations

import os

import pytest
from django.core.exceptions import ImproperlyConfigured

from outbox.contrib.django.conf import url_for
from outbox.store import store_for_url


def test_a_sqlite_file_is_its_absolute_path(tmp_path):
    url = url_for("default", "sqlite", {"NAME": tmp_path / "my shop.sqlite3"})
    assert url == f"sqlite:///{tmp_path}/my%20shop.sqlite3"
    assert store_for_url(url).path == tmp_path / "my shop.sqlite3"  # (the store reads it back)
    relative = url_for("default", "sqlite", {"NAME": "db.sqlite3"})
    assert relative == f"sqlite:///{os.getcwd()}/db.sqlite3"


@pytest.mark.parametrize("name", [":memory:", "file:memorydb_default?mode=memory&cache=shared"])
def test_a_database_in_memory_is_refused_saying_why(name):
    with pytest.raises(ImproperlyConfigured, match="in memory .* the outbox's service needs a file"):
        url_for("default", "sqlite", {"NAME": name})


def test_a_postgresql_database_keeps_its_server_credentials_and_tls():
    url = url_for("default", "postgresql", {
        "NAME": "shop", "USER": "app@shop", "PASSWORD": "p:ss/w@rd", "HOST": "db.internal", "PORT": 6432,
        "OPTIONS": {"sslmode": "verify-full", "sslrootcert": "/etc/ca.pem", "isolation_level": 1, "pool": True}})
    assert url == ("postgresql://app%40shop:p%3Ass%2Fw%40rd@db.internal:6432/shop"
                   "?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem")


def test_a_postgresql_socket_directory_and_defaults():
    assert url_for("default", "postgresql", {"NAME": "shop", "HOST": "/run/postgresql", "PORT": "5433"}) == (
        "postgresql:///shop?host=%2Frun%2Fpostgresql&port=5433")
    assert url_for("default", "postgresql", {"NAME": "shop", "USER": "", "PASSWORD": None, "HOST": "",
                                             "PORT": ""}) == "postgresql:///shop"


def test_options_the_outbox_cannot_pass_on_are_refused_naming_them():
    with pytest.raises(ImproperlyConfigured, match=r"'OPTIONS'\] has assume_role, options, .*OUTBOX\['DATABASE_URL'\]"):
        url_for("default", "postgresql", {"NAME": "shop", "OPTIONS": {"options": "-c search_path=app",
                                                                      "assume_role": "app"}})


def test_another_backend_is_refused():
    with pytest.raises(ImproperlyConfigured, match="'default' is mysql: the outbox keeps its tables in SQLite"):
        url_for("default", "mysql", {"NAME": "shop"})
