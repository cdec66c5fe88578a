"""What one bisect step stands on: the commits of a range, a checkout of one commit in a
temporary `git worktree` (never the user's checkout), and a speech server started from it.

Each arm of a step's A/B is a server process started from its commit's worktree, and the A/B
client is the tts-bench running the bisect, the same for both arms: the only thing that differs
between the arms is the commit the server was built from. By default the server is

    <python> -m tts_bench.cli serve --config <worktree>/<config> --port <port> --concurrency <C>

run in the worktree with the worktree first on PYTHONPATH when it holds `tts_bench/` (this
repository: the commit's own harness and stages), else with the caller's (a repository that
holds only configs: the commit's config served by this tts-bench). `--setup CMD` replaces it for
a server built from another repository: a shell command run in the worktree, with `{port}`,
`{config}` and `{worktree}` filled in, that must serve `/v1/audio/speech` and `/v1/models` on
127.0.0.1:{port} until it is sent SIGTERM (its whole process group is stopped).

    with Worktree(repo, sha) as wt:
        server = Server.start(wt, "configs/bench.yaml", port=free_port(), setup=None, log=path)
        server.wait_ready(timeout_s=120); ...; server.stop()
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tts_bench.errors import BackendError, ConfigError

READY_TIMEOUT_S = 120.0


def git(repo: Path, *args: str) -> str:
    """`git -C repo args...` stdout, stripped; a failure is a ConfigError with git's words."""
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ConfigError(f"error: git {' '.join(args)} failed in {repo}: {proc.stderr.strip() or proc.stdout.strip()} "
                          f"(tts-bench bisect); check --repo, --good and --bad")
    return proc.stdout.strip()


def repo_root(path: Path) -> Path:
    return Path(git(path, "rev-parse", "--show-toplevel"))


def resolve(repo: Path, ref: str, flag: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ConfigError(f"error: {ref!r} is not a commit of {repo} ({flag}); pass a branch, tag or sha of that repository")
    return proc.stdout.strip()


def commits_between(repo: Path, good: str, bad: str) -> list[tuple[str, str]]:
    """(sha, subject) of the first-parent commits after `good` up to and including `bad`, oldest
    first; `good` must be an ancestor of `bad`."""
    if subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", good, bad], check=False).returncode:
        raise ConfigError(f"error: --good {good[:12]} is not an ancestor of --bad {bad[:12]} in {repo} (tts-bench bisect); "
                          "pass a good commit that the bad one descends from")
    out = git(repo, "log", "--reverse", "--first-parent", "--format=%H%x09%s", f"{good}..{bad}")
    commits = [tuple(line.split("\t", 1)) if "\t" in line else (line, "") for line in out.splitlines() if line]
    if not commits:
        raise ConfigError(f"error: no commits between --good and --bad ({good[:12]}..{bad[:12]}) (tts-bench bisect); "
                          "pass two different commits")
    return commits  # type: ignore[return-value]


class Worktree:
    """`git worktree add --detach` of one commit in a temporary folder; removed on exit."""

    def __init__(self, repo: Path, sha: str) -> None:
        self.repo, self.sha = repo, sha
        self.path = Path(tempfile.mkdtemp(prefix=f"tts-bench-bisect-{sha[:8]}-"))

    def __enter__(self) -> Path:
        git(self.repo, "worktree", "add", "--detach", "--force", str(self.path), self.sha)
        return self.path

    def __exit__(self, *exc: object) -> None:
        # `remove` drops this worktree's entry only; a `prune` would touch the user's other entries.
        subprocess.run(["git", "-C", str(self.repo), "worktree", "remove", "--force", str(self.path)],
                       capture_output=True, check=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A speech server process (its own process group) started from a worktree."""

    proc: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, worktree: Path, config: str, *, port: int, setup: str | None, log: Path,
              concurrency: int) -> Server:
        cfg = worktree / config
        env = dict(os.environ)
        if setup is None:
            if not cfg.is_file():
                raise ConfigError(f"error: {config} does not exist at commit {worktree.name} (--config of tts-bench "
                                  "bisect); pass a config path that every commit of the range has")
            cmd: list[str] | str = [sys.executable, "-m", "tts_bench.cli", "serve", "--config", str(cfg),
                                    "--port", str(port), "--concurrency", str(concurrency)]
            if (worktree / "tts_bench").is_dir():  # this repository: the commit's own code serves
                env["PYTHONPATH"] = os.pathsep.join(p for p in (str(worktree), env.get("PYTHONPATH")) if p)
        else:
            # Not str.format: a shell command has braces of its own (`${VAR}`).
            cmd = setup.replace("{port}", str(port)).replace("{config}", str(cfg)).replace("{worktree}", str(worktree))
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as fh:
            proc = subprocess.Popen(cmd, cwd=worktree, env=env, shell=isinstance(cmd, str), stdout=fh,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        return cls(proc, port, log)

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Poll GET /v1/models until it answers; the process dying or the timeout is a BackendError
        that quotes the end of the server's log."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BackendError(f"error: the server exited with {self.proc.returncode} before it answered "
                                   f"({self.log}): {self._tail()}; fix the server command (--setup) or the commit")
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2) as resp:
                    if resp.status < 500:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        self.stop()
        raise BackendError(f"error: the server did not answer {self.url}/v1/models within {timeout_s:g} s ({self.log}): "
                           f"{self._tail()}; check that it listens on the {{port}} it is given")

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def _tail(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        return " | ".join(lines[-3:]) or "empty log"
