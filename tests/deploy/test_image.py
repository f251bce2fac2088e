"""deploy/Dockerfile against the real program. No container engine runs here, so the image is not
built: hadolint lints the file, and what the file says (entrypoint, command, exposed port, health
check, user) is checked by running the installed ``outbox`` the way the image would."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from outbox import Settings

from ..acceptance.conftest import OUTBOX, clean_env
from ..conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
HADOLINT = Path(sys.executable).parent / "hadolint"


def instructions(text: str) -> list[tuple[str, str]]:
    """The Dockerfile's instructions in order, as (KEYWORD, arguments), continuation lines joined."""
    found: list[tuple[str, str]] = []
    logical = ""
    for line in text.splitlines():
        if not logical and (not line.strip() or line.lstrip().startswith("#")):
            continue
        logical += line.rstrip()
        if logical.endswith("\\"):
            logical = logical[:-1] + " "
            continue
        keyword, _, rest = logical.strip().partition(" ")
        found.append((keyword.upper(), rest.strip()))
        logical = ""
    assert not logical, "the Dockerfile ends inside a continued line"
    return found


def the(keyword: str) -> str:
    """The arguments of the last ``keyword`` instruction (the one that takes effect)."""
    given = [rest for kw, rest in instructions(DOCKERFILE.read_text()) if kw == keyword]
    assert given, f"the Dockerfile has no {keyword}"
    return given[-1]


def exec_form(arguments: str) -> list[str]:
    """A JSON-array (exec form) argument list: no shell between the runtime and the program."""
    parsed = json.loads(arguments)
    assert isinstance(parsed, list) and all(isinstance(a, str) for a in parsed), arguments
    return parsed


def healthcheck() -> tuple[dict[str, str], list[str]]:
    """The HEALTHCHECK's options and its exec-form command."""
    options, command = re.fullmatch(r"((?:--\S+\s+)*)CMD\s+(\[.*\])", the("HEALTHCHECK")).groups()
    return dict(o.removeprefix("--").split("=", 1) for o in options.split()), exec_form(command)


def hadolint(path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """hadolint on ``path`` with every rule at its default level, in ``cwd`` (where no
    .hadolint.yaml can relax it), inline ignore pragmas disregarded."""
    return subprocess.run([str(HADOLINT), "--format", "json", "--no-color", "--failure-threshold", "style",
                           "--disable-ignore-pragma", str(path)], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_hadolint_finds_nothing(tmp_path: Path):
    done = hadolint(DOCKERFILE, tmp_path)
    assert (done.returncode, json.loads(done.stdout or "[]")) == (0, []), done.stdout + done.stderr


def test_hadolint_is_live(tmp_path: Path):
    """The lint above can fail: the same file ending as root is reported (DL3002)."""
    rooted = tmp_path / "Dockerfile"
    rooted.write_text(DOCKERFILE.read_text() + "USER root\n")
    done = hadolint(rooted, tmp_path)
    assert done.returncode != 0 and "DL3002" in {f["code"] for f in json.loads(done.stdout)}, done.stdout


def test_two_stages_from_one_pinned_slim_python():
    """The first stage builds the wheels, the second installs them from it; both on the same
    slim Python (3.11 or later), pinned by tag."""
    froms = [rest for kw, rest in instructions(DOCKERFILE.read_text()) if kw == "FROM"]
    assert len(froms) == 2, froms
    (build_image, _, build_name), (runtime_image,) = froms[0].split(), froms[1].split()
    assert build_image == runtime_image and _ == "AS" and build_name == "build", froms
    version = re.fullmatch(r"python:3\.(\d+)-slim(-\w+)?", runtime_image)
    assert version and int(version.group(1)) >= 11, runtime_image
    runs = [rest for kw, rest in instructions(DOCKERFILE.read_text()) if kw == "RUN"]
    assert any("pip wheel" in r for r in runs) and any(f"from={build_name}" in r and "--no-index" in r for r in runs)


def test_entrypoint_is_the_console_script():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert exec_form(the("ENTRYPOINT")) == ["outbox"] and "outbox" in scripts


def test_the_default_command_is_accepted_by_the_program():
    """``outbox <CMD> --help`` succeeds: the subcommand and every flag the image passes exist
    (a renamed flag fails here, as it would fail the container at start)."""
    cmd = exec_form(the("CMD"))
    done = subprocess.run([OUTBOX, *cmd, "--help"], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"Usage: outbox {cmd[0]} "), done.stdout


def test_the_exposed_port_is_the_one_serve_listens_on():
    help_text = subprocess.run([OUTBOX, "serve", "--help"], env=clean_env(), capture_output=True, text=True,
                               timeout=60).stdout
    port = re.search(r"--port INTEGER\s+Listen port \[default: (\d+)\]", help_text)
    assert port, help_text
    assert the("EXPOSE").split() == [port.group(1)] == [str(Settings.model_fields["port"].default)]
    _, command = healthcheck()
    assert f"'OUTBOX_PORT', '{port.group(1)}'" in command[-1], "the health check asks another port by default"


def test_runs_as_a_created_non_root_user_with_a_writable_home():
    user = the("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit() and int(gid) != 0, user  # numeric: runAsNonRoot can tell
    made = " ".join(rest for kw, rest in instructions(DOCKERFILE.read_text()) if kw == "RUN")
    assert f"--uid {uid}" in made and f"--gid {gid}" in made and "--create-home" in made, made
    home = re.search(r"--home-dir (\S+)", made)
    assert home and the("WORKDIR") == home.group(1)
    database = the("ENV")
    assert f"OUTBOX_DATABASE_URL=sqlite:///{home.group(1)}/outbox.db" in database, database


def test_no_secret_in_the_image_and_sigterm_stops_it():
    for keyword, rest in instructions(DOCKERFILE.read_text()):
        if keyword in ("ENV", "ARG", "LABEL"):
            assert not re.search(r"token|secret|password|passwd|api_key|@", rest, re.IGNORECASE), rest
        assert keyword != "ADD", "ADD can fetch and unpack; the image COPYs its own sources"
    assert the("STOPSIGNAL") == "SIGTERM"


# -- the default command, run, and the health check asked of it ---------------------------------


@pytest.fixture
def served(tmp_path: Path) -> Iterator[int]:
    """``outbox <CMD>`` (the image's default) on loopback at a free port, on SQLite in tmp_path;
    yields the port. The host and port are appended, so they override the image's."""
    port = free_port()
    log = tmp_path / "serve.log"
    env = clean_env(OUTBOX_DATABASE_URL=f"sqlite:///{tmp_path / 'outbox.db'}")
    with log.open("w") as out:
        proc = subprocess.Popen([OUTBOX, *exec_form(the("CMD")), "--host", "127.0.0.1", "--port", str(port)],
                                cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        yield port
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM), log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_healthcheck(port: int) -> subprocess.CompletedProcess[str]:
    """The HEALTHCHECK's command as the container runtime runs it, with this venv's python
    (the image's ``python`` on PATH) and OUTBOX_PORT naming the served port."""
    _, command = healthcheck()
    assert command[0] == "python", command
    return subprocess.run([sys.executable, *command[1:]], env=clean_env(OUTBOX_PORT=str(port)),
                          capture_output=True, text=True, timeout=30)


def test_the_health_check_asks_a_real_probe_of_the_default_command(served: int):
    options, command = healthcheck()
    path = re.search(r"'(/[a-z]+)'", command[-1])
    assert path and path.group(1) == "/healthz", command
    response = httpx.get(f"http://127.0.0.1:{served}{path.group(1)}", timeout=5)
    assert response.status_code == 200, response.text
    deadline = time.monotonic() + 20
    while (done := run_healthcheck(served)).returncode != 0:  # the first check may race the embedded sender's start
        assert time.monotonic() < deadline, done.stderr
        time.sleep(0.2)
    # the request gives up before the runtime gives up on the check, and checks do not overlap
    asked = re.search(r"timeout=(\d+)", command[-1])
    assert asked, command
    assert int(asked.group(1)) < int(options["timeout"].removesuffix("s")) <= int(options["interval"].removesuffix("s"))


def test_the_health_check_fails_when_nothing_answers():
    done = run_healthcheck(free_port())
    assert done.returncode != 0 and "Connection refused" in done.stderr, done.stderr


# -- the build context ---------------------------------------------------------------------------


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore leaves ``path`` (relative, /-separated) out: the last pattern that
    matches it or one of its parent directories decides; ``!`` takes back in; ``**/`` may match
    no directory at all."""
    parts = path.split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    verdict = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        pattern = pattern.removeprefix("!").rstrip("/")
        forms = {pattern, pattern.removeprefix("**/")}
        if any(fnmatch.fnmatchcase(c, f) for c in candidates for f in forms):
            verdict = not negated
    return verdict


def test_the_build_context_is_the_sources_only():
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    sent = []
    for directory, dirnames, filenames in os.walk(ROOT):
        rel = os.path.relpath(directory, ROOT)
        prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        dirnames[:] = [d for d in dirnames if d not in (".git", ".venv")]  # asserted below without walking them
        sent += [prefix + f for f in filenames if not ignored(prefix + f, patterns)]
    for left_out in (".git/config", ".venv/bin/python", "tests/conftest.py", "outbox.db", "outbox/x.db-wal",
                     "outbox.toml", "test-artifacts/x", "outbox/__pycache__/cli.cpython-312.pyc", "deploy/Dockerfile",
                     "outbox_delivery.egg-info/PKG-INFO"):
        assert ignored(left_out, patterns), left_out
    needed = re.compile(r"pyproject\.toml|README\.md|LICENSE|(outbox|sender|receivers)/.+")
    stray = [f for f in sent if not needed.fullmatch(f)]
    assert sent and not stray, stray
    size = sum((ROOT / f).stat().st_size for f in sent)
    print(f"build context: {len(sent)} files, {size / 1e6:.1f} MB")
    assert size < 2_000_000, "the README says the build context is under 2 MB"
    # everything the Dockerfile COPYs from the context is sent
    for keyword, rest in instructions(DOCKERFILE.read_text()):
        if keyword == "COPY" and not rest.startswith("--from"):
            *sources, _ = shlex.split(rest)
            for source in sources:
                assert (ROOT / source).exists() and not ignored(source, patterns), source
