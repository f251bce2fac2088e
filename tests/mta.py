"""A private Postfix instance for end-to-end email tests.

The email channel is tested against aiosmtpd servers, which accept whatever they are told to;
a real MTA in between shows that what we send is acceptable to a production mail server too.
``Postfix(relay_host, relay_port)`` runs Debian's postfix as an instance of its own — its own
configuration, queue, data directory and log file under a temporary directory, listening on
127.0.0.1 at a free port only, relaying every message to the given host and port (a sink) and
delivering nothing locally — never the system's mail service, and stops it and removes the
directory on exit::

    with Postfix("127.0.0.1", sink_port) as mta:
        smtplib.SMTP("127.0.0.1", mta.port).sendmail(...)
        ...  # on failure: mta.maillog()

What postfix 3.7 on Debian 12 needed (found by trying it, as root): ``postfix -c DIR`` works
with no /etc/postfix/main.cf at all and needs no ``alternate_config_directories`` (that check
applies to the set-gid postdrop/postqueue run by other users, which this never uses); ``postfix
start`` creates the queue's subdirectories with their owners itself (post-install
create-missing), but the data directory must be chowned to the ``postfix`` user and the
temporary directory made traversable; ``maillog_file`` needs the postlog service in master.cf
and its directory listed in ``maillog_file_prefixes`` (default /var only), and then nothing
needs syslog; ``alias_maps`` must be emptied or smtpd logs errors for a missing
/etc/aliases.db; freshly written main.cf/master.cf are backdated, or postfix waits for them to
"settle" (~2 s at start). It runs under ``postfix start-fg`` in a new session, so master stays
our grandchild; stopping TERMs master and then sees that its process group is gone. Starting
needs root (the daemons drop to the ``postfix`` user) and takes under a second; a relayed
message reaches the sink within a few hundredths of a second, a deferred one is retried after 1 s.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

POSTFIX = "/usr/sbin/postfix"

# Only the services a relay-only instance uses, none chrooted (the chroot would need copies of
# /etc files in the private queue directory). The first line is filled in with the port.
_MASTER_CF = """\
127.0.0.1:{port} inet n - n - - smtpd
pickup    unix  n - n 60 1 pickup
cleanup   unix  n - n - 0 cleanup
qmgr      unix  n - n 300 1 qmgr
rewrite   unix  - - n - - trivial-rewrite
bounce    unix  - - n - 0 bounce
defer     unix  - - n - 0 bounce
trace     unix  - - n - 0 bounce
verify    unix  - - n - 1 verify
flush     unix  n - n 1000? 0 flush
proxymap  unix  - - n - - proxymap
smtp      unix  - - n - - smtp
relay     unix  - - n - - smtp
showq     unix  n - n - - showq
error     unix  - - n - - error
retry     unix  - - n - - error
discard   unix  - - n - - discard
anvil     unix  - - n - 1 anvil
scache    unix  - - n - 1 scache
postlog   unix-dgram n - n - 1 postlogd
"""


def postfix_available() -> bool:
    """Whether Debian's postfix is installed (.ci/run installs it)."""
    return os.access(POSTFIX, os.X_OK)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now (the kernel's ephemeral range)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostfixError(RuntimeError):
    """The private instance could not be started; the message carries its log."""


class Postfix:
    """A private postfix on 127.0.0.1:``port`` relaying everything to ``relay_host:relay_port``."""

    host = "127.0.0.1"

    def __init__(self, relay_host: str, relay_port: int, *, startup_timeout: float = 20.0) -> None:
        self.relay_host = relay_host
        self.relay_port = relay_port
        self.startup_timeout = startup_timeout
        self.port = 0
        self._directory: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    # -- paths ----------------------------------------------------------------------------

    @property
    def directory(self) -> Path:
        """The instance's temporary directory (etc/, queue/, data/, maillog), while it runs."""
        if self._directory is None:
            raise RuntimeError("the instance is not running (use it as a context manager)")
        return self._directory

    @property
    def config_directory(self) -> Path:
        return self.directory / "etc"

    @property
    def queue_directory(self) -> Path:
        return self.directory / "queue"

    @property
    def maillog_path(self) -> Path:
        return self.directory / "maillog"

    def maillog(self) -> str:
        """The instance's log so far (postfix-script, master, smtpd, qmgr, smtp…), for failures."""
        if self._directory is None:
            return "(the instance is stopped; its log was removed with its directory)"
        try:
            log = self.maillog_path.read_text(errors="replace")
        except OSError:
            log = ""
        try:
            output = (self.directory / "start-fg.out").read_text(errors="replace")
        except OSError:
            output = ""
        return log + (f"\n[postfix start-fg output]\n{output}" if output.strip() else "")

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> Postfix:
        if not postfix_available():
            raise PostfixError(f"{POSTFIX} is not installed")
        self._directory = Path(tempfile.mkdtemp(prefix="postfix-test-"))
        try:
            self._configure()
            # The port is free when chosen but could be taken before master binds it: try again.
            for attempt in range(3):
                try:
                    self._start()
                    return self
                except PostfixError:
                    if attempt == 2 or "Address already in use" not in self.maillog():
                        raise
                    self._stop()
                    self.port = free_port()
                    self._write("master.cf", _MASTER_CF.format(port=self.port))
            raise AssertionError("unreachable")
        except BaseException:
            self.close()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop the instance (all its processes) and remove its directory."""
        if self._directory is None:
            return
        try:
            self._stop()
        finally:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None

    def _configure(self) -> None:
        postfix_user = pwd.getpwnam("postfix")
        self.directory.chmod(0o755)  # the daemons run as postfix and open paths under it
        for sub in (self.config_directory, self.queue_directory):
            sub.mkdir(mode=0o755)
        data = self.directory / "data"
        data.mkdir(mode=0o700)
        os.chown(data, postfix_user.pw_uid, postfix_user.pw_gid)
        self.port = free_port()
        name = "postfix-test-" + self.directory.name.rsplit("-", 1)[-1]
        relay = f"[{self.relay_host}]:{self.relay_port}"
        main_cf = {
            "compatibility_level": "3.6",
            "queue_directory": str(self.queue_directory),
            "data_directory": str(data),
            "mail_owner": "postfix",
            "setgid_group": "postdrop",
            "syslog_name": name,  # unique per instance, in case its lines end up side by side
            "maillog_file": str(self.maillog_path),
            "maillog_file_prefixes": str(self.directory),
            "myhostname": "mta.test",
            "inet_interfaces": "127.0.0.1",
            "inet_protocols": "ipv4",
            "mynetworks": "127.0.0.0/8",
            "relayhost": relay,
            # Nothing is delivered here: every domain is remote, and local delivery is an error.
            "mydestination": "",
            "local_transport": "error:this test instance delivers nothing locally",
            "alias_maps": "",
            "alias_database": "",
            "smtp_tls_security_level": "none",
            "smtpd_tls_security_level": "none",
            "smtputf8_enable": "no",
            # Leave at once, and retry a deferred message within a second or two.
            "in_flow_delay": "0",
            "queue_run_delay": "1s",
            "minimal_backoff_time": "1s",
            "maximal_backoff_time": "2s",
            "smtp_connection_cache_on_demand": "no",
            "smtpd_peername_lookup": "no",
            "biff": "no",
            "delay_warning_time": "0",
        }
        self._write("main.cf", "".join(f"{k} = {v}\n" for k, v in main_cf.items()))
        self._write("master.cf", _MASTER_CF.format(port=self.port))

    def _write(self, name: str, text: str) -> None:
        # Postfix rereads a configuration file modified within the last second or so until it
        # is older (in case an editor is still writing it): a new file costs ~0.3 s a read, and
        # `postfix start` reads main.cf a few dozen times. Backdated, it is read at once.
        path = self.config_directory / name
        path.write_text(text)
        past = time.time() - 60
        os.utime(path, (past, past))

    def _start(self) -> None:
        # start-fg keeps master a (grand)child of ours, so it is reaped when it stops; master
        # makes itself a session leader, so `postfix stop`'s group kill never reaches pytest.
        with open(self.directory / "start-fg.out", "ab") as output:
            self._process = subprocess.Popen(
                [POSTFIX, "-c", str(self.config_directory), "start-fg"],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.startup_timeout
        problem = "no answer yet"
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise PostfixError(
                    f"postfix exited with status {self._process.returncode} while starting:\n{self.maillog()}"
                )
            greeting = _greeting(self.host, self.port, timeout=max(0.5, min(5.0, deadline - time.monotonic())))
            if greeting.startswith("220"):
                return
            problem = greeting
            time.sleep(0.1)
        raise PostfixError(
            f"postfix did not greet on {self.host}:{self.port} within {self.startup_timeout:.0f} s "
            f"({problem}):\n{self.maillog()}"
        )

    def _master_pid(self) -> int | None:
        try:
            return int((self.queue_directory / "pid" / "master.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        master = self._master_pid()
        if process.poll() is None:
            if master is not None and _parent(master) == process.pid:
                # What `postfix stop` does, less its script's first one-second sleep: TERM master.
                os.kill(master, signal.SIGTERM)
            else:
                subprocess.run(
                    [POSTFIX, "-c", str(self.config_directory), "stop"],
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=30,
                    check=False,
                )
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                for group in (master, process.pid):
                    if group is not None:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(group, signal.SIGKILL)
                process.wait(timeout=5)
        # Master's children (smtpd, qmgr…) are in master's process group; see that none is left.
        if master is not None and master != os.getpgrp():
            _end_group(master)


def _end_group(pgid: int) -> None:
    """TERM what is left of a process group, KILL it if it lingers, for a few seconds at most."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
        if not _live_members(pgid):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + wait
        while _live_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)


def _parent(pid: int) -> int | None:
    try:
        stat = Path("/proc", str(pid), "stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def _live_members(pgid: int) -> list[int]:
    """The processes of a group that have not exited: ones that have but that init has not
    reaped yet (it may take a second) are zombies, still members for kill(2), and harmless."""
    live = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, pgrp, …
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            live.append(int(entry))
    return live


def _greeting(host: str, port: int, timeout: float) -> str:
    """The first line an SMTP server at host:port sends, or why there is none."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            data = b""
            while b"\n" not in data:
                chunk = sock.recv(1024)
                if not chunk:
                    break
                data += chunk
            with contextlib.suppress(OSError):
                sock.sendall(b"QUIT\r\n")
            return data.decode(errors="replace").strip() or "connection closed without a greeting"
    except OSError as error:
        return f"{type(error).__name__}: {error}"
