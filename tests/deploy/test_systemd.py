"""deploy/systemd/ against systemd and the real program: ``systemd-analyze verify`` on the units
(with their shared drop-in), each ExecStart accepted by the installed ``outbox``, the migration
unit's command run for real, and stop timeouts above the worker's drain time."""

from __future__ import annotations

import asyncio
import configparser
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from outbox import Settings
from outbox.keyring import generate_key

from .. import pg
from ..acceptance.conftest import OUTBOX, clean_env

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
DROP_IN = UNITS / "outbox-.service.d" / "10-common.conf"
#: The second drop-in, installed as outbox-.service.d/20-secrets-key.conf where the key is kept apart.
KEY_DROP_IN = UNITS / "secrets-key.conf"
SERVICES = ("outbox-migrate.service", "outbox-serve.service", "outbox-worker.service")
#: Where the units expect the installed program (a venv at /opt/outbox; see the README).
INSTALLED = "/opt/outbox/bin/outbox"
#: How much longer than the drain systemd waits before it kills: the drain may end just as a send
#: is answered, and the store still has to record it and close.
STOP_MARGIN = 5.0


def unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes=("#", ";"))
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string(path.read_text())
    return parser


def seconds(value: str) -> float:
    """A systemd time span such as 30s, 1min 30s or 45 (seconds)."""
    factors = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value)
    assert parts and "".join(f"{n}{u}" for n, u in parts) == value.replace(" ", ""), value
    return sum(float(n) * factors[u] for n, u in parts)


def verify(directory: Path, *names: str) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze verify`` of ``names`` as units found in ``directory`` (drop-ins included),
    ahead of the system's own unit directories (for targets such as network-online.target)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        if os.environ.get("CI") == "true":
            pytest.fail("systemd-analyze is missing in CI")
        pytest.skip("systemd-analyze is not installed here")
    return subprocess.run([analyze, "verify", *names], cwd=directory, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SYSTEMD_UNIT_PATH": f"{directory}:"})


def installed_copy(tmp_path: Path) -> Path:
    """The units as they would be installed, but with this venv's ``outbox`` where the units name
    /opt/outbox/bin/outbox (which does not exist here, and verify checks that it is executable)."""
    target = tmp_path / "units"
    shutil.copytree(UNITS, target)
    for name in SERVICES:
        text = (target / name).read_text()
        assert f"ExecStart={INSTALLED} " in text, name
        (target / name).write_text(text.replace(INSTALLED, OUTBOX))
    return target


def test_systemd_analyze_verify_reports_nothing(tmp_path: Path):
    done = verify(installed_copy(tmp_path), *SERVICES)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_verify_reads_the_shared_drop_in(tmp_path: Path):
    """The check above can fail, and covers the drop-in: a misspelt key in it is reported."""
    copy = installed_copy(tmp_path)
    dropped = copy / DROP_IN.relative_to(UNITS)
    dropped.write_text(dropped.read_text() + "NoNewPrivilege=yes\n")
    done = verify(copy, "outbox-worker.service")
    assert "Unknown key 'NoNewPrivilege'" in done.stderr, done.stderr


def test_the_units_as_shipped_only_miss_the_installed_program():
    """Unchanged, verify's only complaint is the program at /opt/outbox, not installed here."""
    done = verify(UNITS, *SERVICES)
    complaints = set((done.stdout + done.stderr).splitlines())
    assert complaints == {f"{name}: Command {INSTALLED} is not executable: No such file or directory"
                          for name in SERVICES}, complaints


def test_every_unit_runs_the_installed_program_with_arguments_it_accepts():
    for name in SERVICES:
        program, *arguments = shlex.split(unit(UNITS / name)["Service"]["ExecStart"])
        assert program == INSTALLED, name
        done = subprocess.run([OUTBOX, *arguments, "--help"], env=clean_env(), capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0 and done.stdout.startswith(f"Usage: outbox {arguments[0]} "), (
            name, done.stdout + done.stderr)


def test_the_migration_unit_migrates(tmp_path: Path):
    """What outbox-migrate.service runs, run here on a fresh SQLite file: it succeeds, and a second
    run (the next boot) too."""
    _, *arguments = shlex.split(unit(UNITS / "outbox-migrate.service")["Service"]["ExecStart"])
    env = clean_env(OUTBOX_DATABASE_URL=f"sqlite:///{tmp_path / 'outbox.db'}")
    for _ in range(2):
        done = subprocess.run([OUTBOX, *arguments], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "outbox.db").stat().st_size > 0


def test_stopping_waits_longer_than_the_drain_and_signals_sigterm():
    drain = Settings.model_fields["drain_seconds"].default
    for name in ("outbox-serve.service", "outbox-worker.service"):
        service = unit(UNITS / name)["Service"]
        assert service["KillSignal"] == "SIGTERM", name
        assert seconds(service["TimeoutStopSec"]) >= drain + STOP_MARGIN, (name, service["TimeoutStopSec"], drain)
        assert service["Restart"] == "on-failure", name


def test_serve_and_worker_start_after_the_migration():
    for name in ("outbox-serve.service", "outbox-worker.service"):
        section = unit(UNITS / name)["Unit"]
        assert "outbox-migrate.service" in section["Requires"].split(), name
        assert "outbox-migrate.service" in section["After"].split(), name
    assert unit(UNITS / "outbox-migrate.service")["Service"]["Type"] == "oneshot"


def test_the_shared_drop_in_runs_every_unit_unprivileged_and_sandboxed():
    assert all(name.startswith(DROP_IN.parent.name.removesuffix(".service.d")) for name in SERVICES)
    common = unit(DROP_IN)["Service"]
    assert common["User"] == common["Group"] == "outbox"
    assert common["EnvironmentFile"] == "/etc/outbox/outbox.env"  # root-owned, 0600: read before the drop
    assert common["StateDirectory"] == "outbox" and common["WorkingDirectory"] == "/var/lib/outbox"
    expected = {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
                "PrivateDevices": "yes", "CapabilityBoundingSet": "", "UMask": "0077",
                "SystemCallFilter": "@system-service"}
    assert {key: common.get(key) for key in expected} == expected
    for name in SERVICES:
        service = unit(UNITS / name)["Service"]
        assert not {"User", "Group", "EnvironmentFile", "Environment"} & set(service), name  # one place for them
    sysusers = (UNITS / "outbox.sysusers.conf").read_text()
    assert re.search(r"^u outbox - \"[^\"]+\" /var/lib/outbox /usr/sbin/nologin$", sysusers, re.MULTILINE)


def test_the_secrets_key_drop_in_verifies_and_hands_the_key_file_to_every_unit(tmp_path: Path):
    """Installed beside the common drop-in, systemd accepts it; its OUTBOX_SECRETS_KEY_FILE is the
    credential it loads (``%d`` is the unit's credentials directory), and what the migration unit
    runs with such a file migrates a PostgreSQL database, where a key file is required."""
    copy = installed_copy(tmp_path)
    shutil.copy(KEY_DROP_IN, copy / DROP_IN.parent.name / "20-secrets-key.conf")
    done = verify(copy, *SERVICES)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")
    service = unit(KEY_DROP_IN)["Service"]
    credential, source = service["LoadCredential"].split(":", 1)
    assert source == "/etc/outbox/secrets.key" and service["Environment"] == f"OUTBOX_SECRETS_KEY_FILE=%d/{credential}"

    credentials = tmp_path / "credentials"  # what systemd makes of %d, holding the copied key
    credentials.mkdir()
    (credentials / credential).write_text(generate_key() + "\n")
    _, *arguments = shlex.split(unit(UNITS / "outbox-migrate.service")["Service"]["ExecStart"])
    url = asyncio.run(pg.create_database())
    try:
        env = clean_env(OUTBOX_DATABASE_URL=url,
                        OUTBOX_SECRETS_KEY_FILE=service["Environment"].split("=", 1)[1].replace("%d", str(credentials)))
        migrated = subprocess.run([OUTBOX, *arguments], cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=60)
        assert migrated.returncode == 0, migrated.stderr
        env.pop("OUTBOX_SECRETS_KEY_FILE")
        without = subprocess.run([OUTBOX, *arguments], cwd=tmp_path, env=env, capture_output=True, text=True,
                                 timeout=60)
        assert without.returncode != 0 and "OUTBOX_SECRETS_KEY_FILE is not set" in without.stderr
    finally:
        asyncio.run(pg.drop_database(url))
