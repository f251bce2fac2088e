"""A small Django project (``tests/djangoshop``) that enqueues in its views' transactions, as an
application does: its database is ``SHOP_DATABASE_URL`` (``sqlite:///path`` or
``postgresql://user@host:port/name``), each request runs in a transaction (``ATOMIC_REQUESTS``),
and the outbox's app is installed."""

import os
from urllib.parse import unquote, urlsplit

_url = urlsplit(os.environ["SHOP_DATABASE_URL"])
if _url.scheme == "sqlite":
    _database = {"ENGINE": "django.db.backends.sqlite3", "NAME": unquote(_url.path[1:]),
                 "OPTIONS": {"transaction_mode": "IMMEDIATE"}}
else:
    _database = {"ENGINE": "django.db.backends.postgresql", "NAME": _url.path[1:], "USER": _url.username or "",
                 "PASSWORD": _url.password or "", "HOST": _url.hostname or "", "PORT": str(_url.port or "")}

SECRET_KEY = "tests-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1"]
ROOT_URLCONF = "shop.urls"
INSTALLED_APPS = ["outbox.contrib.django", "shop"]
MIDDLEWARE: list[str] = []
DATABASES = {"default": {**_database, "ATOMIC_REQUESTS": True}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
OUTBOX = {"DATABASE": "default"}
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "handlers": {"console": {"class": "logging.StreamHandler"}},
           "loggers": {"django": {"handlers": ["console"], "level": "INFO"}}}
