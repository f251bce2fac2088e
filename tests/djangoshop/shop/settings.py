"""A small Django project (``tests/djangoshop``) that enqueues in its views' transactions, as an
application does: its database is ``SHOP_DATABASE_URL`` (``sqlite:///path`` or
``postgresql://user@host:port/name``), each request runs in a transaction (``ATOMIC_REQUESTS``),
and the outbox's app is installed."""

import os
from urllib.parse import unquote, urlsplit

_url = urlsplit(os.environ["SHOP_DATABASE_URL"])
if _url.scheme == "sqlite":
    _name = unquote(_url.path[1:])
    _database = {"ENGINE": "django.db.backends.sqlite3", "NAME": _name, "OPTIONS": {"transaction_mode": "IMMEDIATE"},
                 "TEST": {"NAME": _name.removesuffix(".sqlite3") + "-test.sqlite3"}}  # (a file the outbox can open)
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
OUTBOX = {"DATABASE": "default", "MIGRATE": os.environ.get("SHOP_OUTBOX_MIGRATE", "1") == "1"}
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "handlers": {"console": {"class": "logging.StreamHandler"}},
           "loggers": {"django": {"handlers": ["console"], "level": "INFO"}}}
