"""OS isolation for a student's code during grading: bubblewrap, an unprivileged user id, rlimits.

    iso = Isolation.detect(course_root=root, hide=[submissions, out])   # iso.on False: iso.reason says why
    argv = iso.wrap([sys.executable, "-m", "coursekit.course.sandbox", ...])
    iso = for_batch(None, course_root=root, hide=...)     # what grade() uses: refuses (raises) when none is there

What a wrapped command gets (Linux tools only: ``bwrap`` from Debian's *bubblewrap*, ``setpriv`` and ``prlimit``
from *util-linux*, and for a grader that is not root ``unshare --map-auto`` with *uidmap*'s ``newuidmap``):

- a user id of its own, drawn at random for each start from a range no account uses; never root, never the
  instructor's. As root the range is ``COURSEKIT_SANDBOX_UIDS`` (default 1600000000-1600999999); otherwise the
  instructor's subordinate ids from /etc/subuid (``unshare --map-auto``), as rootless containers use;
- its own mount namespace: /usr, /etc, the Python installation, the venv, the course library and the course folder
  read-only (and the folders in ``COURSEKIT_SANDBOX_RO``, e.g. a CUDA toolkit outside /usr), with ``solutions/``,
  ``.git``, nbgrader's ``course/`` and every path in ``hide`` (the submissions, the output folder) replaced by
  empty read-only folders; a private /tmp and /dev/shm of ``limits.tmp`` bytes each (also $HOME); nothing else
  (no /home, /root, /run, /var, /mnt; /etc/hosts names the sandbox 127.0.0.1);
- its own network (loopback only: a torchrun/gloo job inside works, any other address is unreachable), process,
  IPC and UTS namespaces: it sees its own processes only, and when it ends every process it started ends too;
- limits per process: CPU seconds, data memory (RLIMIT_DATA, which counts heap and anonymous memory but not the
  address space CUDA reserves), file size, and a process count for its user id (a fork bomb stops there);
- no capabilities, no_new_privs (setuid programs do not raise it), a cleared environment (only the variables in
  ``_KEEP`` pass: no tokens or keys of the instructor's), and on a GPU machine the /dev/nvidia* nodes only.
"""
from __future__ import annotations

import json
import os
import pwd
import random
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT_UIDS = (1_600_000_000, 1_600_999_999)
_KEEP = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONUNBUFFERED", "PYTHONHASHSEED", "MPLBACKEND",
         "TOKENIZERS_PARALLELISM", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "DS_ACCELERATOR",
         "TORCH_EXTENSIONS_DIR", "COURSEKIT_RESULTS_DIR", "COURSEKIT_PROGRESS")
_KEEP_PREFIX = ("OMP_", "MKL_", "COURSEKIT_DEVICE", "COURSEKIT_LAUNCH", "NCCL_", "HF_HUB_OFFLINE",
                "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "GLOO_", "TORCH_DISTRIBUTED_DEBUG", "TORCH_NCCL_")
_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class IsolationUnavailable(ValueError):
    """No sandbox can be built here; ``coursekit course grade --trust-submissions`` grades without one."""


def _size(text: str) -> int:
    t = str(text).strip().lower().removesuffix("b").removesuffix("i")
    return int(float(t[:-1]) * _UNITS[t[-1]]) if t and t[-1] in _UNITS else int(t)


@dataclass(frozen=True)
class Limits:
    """Per-sandbox limits (``--sandbox-limits cpu=600,memory=8G,nproc=256,fsize=1G,tmp=1G``)."""

    cpu: int = 1800  # CPU seconds per process (RLIMIT_CPU; SIGXCPU then SIGKILL)
    memory: int = 8 << 30  # bytes of data memory per process (RLIMIT_DATA)
    nproc: int = 512  # processes and threads of the sandbox's user id (RLIMIT_NPROC)
    fsize: int = 1 << 30  # bytes: largest file it may write, its log included (RLIMIT_FSIZE)
    tmp: int = 1 << 30  # bytes of its private /tmp and of its /dev/shm (tmpfs, counted in RAM)

    @classmethod
    def parse(cls, text: str | None) -> "Limits":
        if not text:
            return cls()
        kw = {}
        for item in text.split(","):
            key, _, value = item.partition("=")
            key = key.strip()
            if key not in cls.__dataclass_fields__:
                raise ValueError(f"unknown sandbox limit {key!r} (one of {', '.join(cls.__dataclass_fields__)})")
            kw[key] = int(value) if key in ("cpu", "nproc") else _size(value)
        return cls(**kw)


@dataclass(frozen=True)
class Isolation:
    """How to wrap a command; JSON-able (the batch hands it to each grader process)."""

    mechanism: str  # "root" (bwrap as root, then setpriv) | "subuid" (unshare --map-auto, bwrap, setpriv) | "off"
    reason: str = ""  # why "off"
    uids: tuple[int, int] = ROOT_UIDS  # user ids a sandbox runs as (inside its user namespace for "subuid")
    limits: Limits = field(default_factory=Limits)
    readonly: tuple[str, ...] = ()  # bound read-only
    hide: tuple[str, ...] = ()  # replaced by empty folders (when they lie under a read-only path)
    devices: tuple[str, ...] = ()  # device nodes bound in (the GPU's)
    tools: dict = field(default_factory=dict)  # absolute paths of bwrap, prlimit, setpriv, unshare

    @property
    def on(self) -> bool:
        return self.mechanism != "off"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "Isolation | None":
        if not d:
            return None
        d = dict(d)
        d["limits"] = Limits(**d["limits"])
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})

    # -- building ------------------------------------------------------------------------------------------------
    @classmethod
    def detect(cls, *, course_root: str | Path | None = None, hide=(), limits: Limits | None = None,
               probe: bool = True) -> "Isolation":
        """The sandbox this machine can build (``mechanism == "off"`` with the reason if none)."""
        import coursekit

        limits = limits or Limits()
        tools = {t: shutil.which(t) for t in ("bwrap", "setpriv", "prlimit", "unshare", "newuidmap", "env")}
        missing = [t for t in ("bwrap", "setpriv", "prlimit") if tools[t] is None]
        if missing:
            return cls("off", reason=f"{', '.join(missing)} not found (Debian: apt-get install bubblewrap "
                                     f"util-linux)", limits=limits)
        if os.geteuid() == 0:
            mech, uids = "root", _uid_range(os.environ.get("COURSEKIT_SANDBOX_UIDS"))
        else:
            sub = _subuid_range()
            if isinstance(sub, str):
                return cls("off", reason=sub, limits=limits)
            mech, uids = "subuid", sub
        pkg = Path(coursekit.__file__).resolve().parent
        ro = [Path(sys.prefix), Path(sys.base_prefix), pkg.parent]
        if course_root:
            root = Path(course_root).resolve()
            ro.append(root)
            hide = [root / "solutions", root / ".git", root / "course", *hide]
        ro += [Path(p) for p in os.environ.get("COURSEKIT_SANDBOX_RO", "").split(os.pathsep) if p]  # e.g. CUDA
        ext = os.environ.get("TORCH_EXTENSIONS_DIR")
        if ext and Path(ext).is_dir():
            ro.append(Path(ext))  # compiled DeepSpeed ops, shared read-only
        devices = sorted(str(p) for p in Path("/dev").glob("nvidia*") if not p.is_dir())
        devices += sorted(str(p) for p in Path("/dev").glob("nvidia-caps/*"))
        iso = cls(mech, uids=uids, limits=limits, readonly=tuple(dict.fromkeys(str(p.resolve()) for p in ro)),
                  hide=tuple(dict.fromkeys(str(Path(h).resolve()) for h in hide)), devices=tuple(devices),
                  tools=tools)
        if probe:
            err = iso.probe()
            if err:
                return cls("off", reason=f"{mech} sandbox failed to start: {err}", limits=limits)
        return iso

    def probe(self) -> str:
        """'' if a sandbox starts here and has its own user id and loopback-only network, else what went wrong."""
        code = ("import os, socket; s = socket.socket(); e = s.connect_ex(('192.0.2.1', 9)); "
                "print(os.getuid(), e)")
        try:
            p = subprocess.run(self.wrap([sys.executable, "-c", code]), capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            return str(e)
        if p.returncode != 0:
            return (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
        import errno

        uid, err = map(int, p.stdout.split())
        if uid in (0, os.getuid()) or err != errno.ENETUNREACH:
            return f"not isolated (uid {uid}, connect to 192.0.2.1 gave errno {err})"
        return ""

    def wrap(self, argv: list[str], *, rw=(), ro=(), env: dict | None = None, uid: int | None = None) -> list[str]:
        """``argv`` as a command that runs it in a fresh sandbox (``rw``/``ro``: more folders bound read-write or
        read-only at the same path; ``env``: the variables to pick from, default os.environ)."""
        if not self.on:
            return list(argv)
        uid = uid if uid is not None else random.randint(*self.uids)
        tool = {t: self.tools.get(t) or t for t in ("bwrap", "setpriv", "prlimit", "unshare")}
        cmd = []
        if self.mechanism == "subuid":  # unshare runs newuidmap from PATH (a grader's PATH may be the venv's only)
            path = os.pathsep.join(dict.fromkeys([os.path.dirname(self.tools.get("newuidmap") or "/usr/bin/x"),
                                                  "/usr/bin", "/bin"]))
            cmd = [self.tools.get("env") or "env", f"PATH={path}", tool["unshare"], "--map-auto", "--setuid", "0",
                   "--setgid", "0", "--"]
        cmd += [tool["bwrap"], "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--hostname", "sandbox",
                "--ro-bind", "/usr", "/usr"]
        for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            p = Path("/") / top
            if p.is_symlink():
                cmd += ["--symlink", os.readlink(p), str(p)]
            elif p.is_dir():
                cmd += ["--ro-bind", str(p), str(p)]
        cmd += ["--ro-bind", "/etc", "/etc", "--ro-bind", _hosts_file(), "/etc/hosts",  # its name is loopback's
                "--ro-bind-try", "/sys", "/sys", "--proc", "/proc", "--dev", "/dev",
                "--perms", "1777", "--size", str(self.limits.tmp), "--tmpfs", "/tmp",
                "--perms", "1777", "--size", str(self.limits.tmp), "--tmpfs", "/dev/shm"]
        for d in self.devices:
            cmd += ["--dev-bind-try", d, d]
        for p in sorted(self.readonly, key=len):  # a folder before the folders in it
            if not p.startswith(("/usr/", "/etc/")) and p != "/usr":
                cmd += ["--ro-bind", p, p]
        for p in ro:
            cmd += ["--ro-bind", str(p), str(p)]
        for p in rw:
            cmd += ["--bind", str(p), str(p)]
        bound = [*self.readonly, *map(str, rw), *map(str, ro), "/usr", "/etc", "/sys"]  # the host's folders
        for a in sorted({str(a) for p in bound for a in Path(p).parents if str(a) != "/"}):
            if a not in ("/tmp", "/dev", "/dev/shm") and not any(a == b or a.startswith(b.rstrip("/") + "/")
                                                                 for b in bound):
                cmd += ["--chmod", "0755", a]  # bwrap copies a parent's mode (/root is 0700): let the user pass
        for h in self.hide:  # after the binds, so an empty folder covers what lies beneath
            if not any(h == r or h.startswith(r.rstrip("/") + "/") for r in (*self.readonly, "/usr", "/etc")):
                continue  # not in the sandbox's view anyway
            if Path(h).is_dir():
                cmd += ["--tmpfs", h, "--remount-ro", h]
            elif Path(h).exists():
                cmd += ["--ro-bind", "/dev/null", h]
        cmd += ["--chdir", "/tmp", "--clearenv"]
        for k, v in sandbox_env(env).items():
            cmd += ["--setenv", k, v]
        lim = self.limits
        cmd += ["--", tool["prlimit"], f"--cpu={lim.cpu}", f"--data={lim.memory}", f"--nproc={lim.nproc}",
                f"--fsize={lim.fsize}", "--core=0", "--",
                tool["setpriv"], f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                "--bounding-set=-all", "--no-new-privs", "--",
                "/bin/sh", "-c", 'umask 000; exec "$@"', "sandbox", *argv]
        return cmd


def for_batch(mode: str | None, *, course_root, hide=(), limits: Limits | None = None) -> Isolation | None:
    """The sandbox a grading batch uses: None for mode "off" (or "auto" where none can be built); raises
    IsolationUnavailable for "required" (the default, or $COURSEKIT_ISOLATION) where none can be built."""
    mode = mode or os.environ.get("COURSEKIT_ISOLATION") or "required"
    if mode not in ("required", "auto", "off"):
        raise ValueError(f"isolation must be required, auto or off, got {mode!r}")
    if mode == "off":
        return None
    if isinstance(limits, str) or limits is None:
        limits = Limits.parse(limits or os.environ.get("COURSEKIT_SANDBOX_LIMITS"))
    iso = Isolation.detect(course_root=course_root, hide=hide, limits=limits)
    if iso.on:
        return iso
    if mode == "auto":
        return None
    raise IsolationUnavailable(f"refusing to grade untrusted submissions without a sandbox: {iso.reason}. Install "
                               f"bubblewrap (and uidmap with an /etc/subuid range when not root), or pass "
                               f"--trust-submissions to run the students' code as yourself")


def _hosts_file() -> str:
    """An /etc/hosts for sandboxes: their host name ``sandbox`` is 127.0.0.1 (torchrun hands workers the agent's
    host name as MASTER_ADDR; the host's own name would point at an address the sandbox's network lacks)."""
    path = Path(tempfile.gettempdir()) / "coursekit-sandbox-hosts"
    text = "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    if not path.is_file() or path.read_text() != text:
        tmp = path.with_name(f"{path.name}.{os.getpid()}")
        tmp.write_text(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    return str(path)


def make_reachable(path: Path) -> None:
    """Let bwrap reach ``path`` from a subordinate user id: search (not list) permission on the folders above it
    that this process made in the temporary folder (mkdtemp makes them 0700)."""
    tmp = Path(tempfile.gettempdir()).resolve()
    for a in Path(path).resolve().parents:
        if a == tmp or tmp not in a.parents:
            break
        st = a.stat()
        if st.st_uid == os.getuid() and not st.st_mode & 0o001:
            os.chmod(a, (st.st_mode & 0o7777) | 0o011)


def sandbox_env(env: dict | None) -> dict:
    """The variables a sandboxed process gets: the allowed ones of ``env`` (default os.environ), HOME=/tmp."""
    env = os.environ if env is None else env
    out = {k: v for k, v in env.items() if k in _KEEP or k.startswith(_KEEP_PREFIX)}
    path = [p for p in out.get("PATH", "").split(os.pathsep) if p]
    out["PATH"] = os.pathsep.join(dict.fromkeys(path + ["/usr/local/bin", "/usr/bin", "/bin"]))  # gcc, for one
    out.update(HOME="/tmp", TMPDIR="/tmp", USER="student", LOGNAME="student", MPLCONFIGDIR="/tmp/.matplotlib",
               TORCHINDUCTOR_CACHE_DIR="/tmp/.inductor", IPYTHONDIR="/tmp/.ipython")
    return out


def _uid_range(text: str | None) -> tuple[int, int]:
    if not text:
        return ROOT_UIDS
    lo, _, hi = text.partition("-")
    lo, hi = int(lo), int(hi or lo)
    if lo <= 0 or hi < lo:
        raise ValueError(f"COURSEKIT_SANDBOX_UIDS must be FIRST-LAST with 0 < FIRST <= LAST, got {text!r}")
    return lo, hi


def _subuid_range() -> tuple[int, int] | str:
    """User ids inside ``unshare --map-auto``'s namespace that map to this user's subordinate ids."""
    if shutil.which("unshare") is None or shutil.which("newuidmap") is None:
        return "not root, and no newuidmap (Debian: apt-get install uidmap) to run as a subordinate user id"
    me = pwd.getpwuid(os.getuid()).pw_name
    for line in Path("/etc/subuid").read_text().splitlines() if Path("/etc/subuid").is_file() else []:
        name, _, rest = line.partition(":")
        if name in (me, str(os.getuid())):
            count = int(rest.split(":")[1])
            if count >= 2:
                return 1, min(count - 1, 65533)  # inner 0 is the namespace's root, which only sets it up
    return f"not root, and /etc/subuid has no range for {me} (ask for one: usermod --add-subuids)"


def kernel_main(argv: list[str]) -> int:
    """Start an IPython kernel in a sandbox (nbgrader's kernel spec runs this, outside, as the grader).

    ``python -m coursekit.course.isolation kernel SPEC.json CONNECTION_FILE [kernel args]``: the connection file is
    copied into the socket folder (the kernel's user cannot read the grader's 0600 file), then bwrap takes over."""
    spec = json.loads(Path(argv[0]).read_text())
    iso = Isolation.from_dict(spec["isolation"])
    sock = Path(spec["socket_dir"])
    conn = sock / "connection.json"
    shutil.copy(argv[1], conn)
    os.chmod(conn, 0o644)
    cmd = iso.wrap([sys.executable, "-m", "ipykernel_launcher", "-f", str(conn), *argv[2:]], rw=[sock])
    os.execvp(cmd[0], cmd)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["kernel"]:
        return kernel_main(argv[1:])
    iso = Isolation.detect()
    if not iso.on:
        print(f"no sandbox: {iso.reason}")
        return 1
    print(f"sandbox: {iso.mechanism}, user ids {iso.uids[0]}-{iso.uids[1]}, limits {iso.limits}, "
          f"devices {list(iso.devices) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
