"""Entry-point tests start `python train.py ...` hundreds of times, and each start spends ~7 s of CPU importing
torch, Lightning, Hydra and W&B before the script does anything (measured: 6-9 s for ``import lightning.pytorch`` on
an AVX2 EPYC core). This module runs those commands in a process forked from a *preloaded* interpreter instead: a
server, one per xdist worker, that imported the third-party libraries once and never ran any of their code. Each
command gets its own forked process, which then becomes exactly what ``python <script> <args>`` would be: the
requested cwd, environment, argv, ``sys.path[0]``, stdin, stdout and stderr files, its own process group, and the
script run as ``__main__`` (``runpy``), so exit status, tracebacks, atexit handlers (W&B's flush) and signals are
the real ones. The project's own package is *not* preloaded: it is imported fresh in every command, as in a new
interpreter.

``run(args, **kwargs)`` takes ``subprocess.run``'s arguments and falls back to a real ``subprocess.run`` for anything
a preloaded interpreter cannot reproduce: a command that is not ``python <script.py>`` / ``python -m <module>``,
interpreter flags, an environment that differs from the server's in a variable read at interpreter or library start
(``PYTHON*``, ``LD_*``, ``OMP_*``, ...; PYTHONPATH is redone in the child unless a folder it adds holds a
``sitecustomize`` not marked fork-safe, see FORK_SAFE), uncaptured output, a command already running on this worker, or a server that failed to start.
``ATTNLAB_TEST_FRESH_PROCESSES=1`` makes every command a real new interpreter (the suite can run both ways).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# imported once by the server; each is optional (a missing one is simply imported by the command itself)
PRELOAD = ("numpy", "torch", "lightning", "lightning.pytorch", "torchmetrics", "omegaconf", "hydra",
           "hydra._internal.utils", "hydra.core.utils", "wandb", "wandb.sdk.launch.inputs.internal",
           "lightning.pytorch.loggers.wandb", "tokenizers", "matplotlib", "matplotlib.figure", "rich", "sacrebleu",
           "sklearn.datasets", "scipy.signal", "yaml", "PIL.Image")
# environment variables read when an interpreter or a native library starts: a command that sets one differently
# from the server gets a real new interpreter (PYTHONPATH aside: see _python_path)
STARTUP_ENV = re.compile(r"^(PYTHON(?!UNBUFFERED$|PATH$)|LD_|OMP_|MKL_|KMP_|GOMP_|OPENBLAS|MALLOC|TORCH|PYTORCH|CUDA|MPL)")


def _startup_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if STARTUP_ENV.match(k)}


def _python_path(env: dict[str, str], cwd: str) -> list[str]:
    """The sys.path entries an interpreter started in ``cwd`` takes from PYTHONPATH (absolute; empty means cwd)."""
    value = env.get("PYTHONPATH")
    return [os.path.abspath(os.path.join(cwd, entry)) for entry in value.split(os.pathsep)] if value else []


# A test's sitecustomize that only patches names looked up at call time (the disk-full injector replaces
# builtins.open and io.open) may be imported by the forked child instead, before the script runs: it says so with this
# line. Any other start-up module gets a new interpreter.
FORK_SAFE = "# preloaded_python: fork-safe"


def _runs_at_start(folder: str) -> bool:
    return any(os.path.exists(os.path.join(folder, name))
               for name in ("sitecustomize.py", "sitecustomize", "usercustomize.py")) and not _fork_safe(folder)


def _fork_safe(folder: str) -> bool:
    path = os.path.join(folder, "sitecustomize.py")
    if not os.path.isfile(path) or any(os.path.exists(os.path.join(folder, n)) for n in ("sitecustomize",
                                                                                        "usercustomize.py")):
        return False
    with open(path) as f:
        return FORK_SAFE in f.read().splitlines()


# --------------------------------------------------------------------------------------------------------- server

def _serve(path: str) -> dict:
    """Accept one request at a time, fork a child for it, report its wait status. Returns only in a child."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)
    listener.settimeout(5)
    parent = os.getppid()
    # what preloading left in the start-up variables (sklearn's import sets KMP_DUPLICATE_LIB_OK, with setdefault)
    print("ready", json.dumps(_startup_env(dict(os.environ))), flush=True)
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            if os.getppid() != parent:  # the test process is gone (killed): so is the reason to serve
                import shutil

                shutil.rmtree(os.path.dirname(path), ignore_errors=True)
                os._exit(0)
            continue
        conn.settimeout(None)
        with conn:
            try:
                request = json.loads(conn.makefile("r").readline())
            except ValueError:  # a client that failed before sending its request: serve the next one
                continue
            pid = os.fork()
            if pid == 0:
                listener.close()
                return request
            deadline = time.monotonic() + request["timeout"] if request.get("timeout") else None
            timed_out = False
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    timed_out = True
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    _, status = os.waitpid(pid, 0)
                    break
                time.sleep(0.02)
            conn.sendall((json.dumps({"status": status, "timed_out": timed_out}) + "\n").encode())


def _become(request: dict, shared_folders: list[tempfile.TemporaryDirectory]) -> None:
    """In the forked child: turn into ``python <argv>``, run it, and end the way the interpreter ends a script."""
    import atexit
    import runpy
    import warnings

    os.setpgid(0, 0)
    for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, (name, flags) in enumerate([(request["stdin"], os.O_RDONLY), (request["stdout"], os.O_WRONLY),
                                        (request["stderr"], os.O_WRONLY)]):
        if fd == 2 and name == request["stdout"]:  # 2>&1: one open file, one offset
            os.dup2(1, 2)
            continue
        target = os.open(name, flags | (os.O_APPEND if fd else 0))
        os.dup2(target, fd)
        os.close(target)
    warnings._filters_mutated()  # warnings already shown by the server's imports are shown again
    started = set(_python_path(request["server_env"], request["server_cwd"]))
    rest = [p for p in sys.path[1:] if p not in started]
    sys.path[1:] = list(dict.fromkeys(_python_path(request["env"], request["cwd"]) + rest))
    # temporary folders a library made at import (W&B's media and artifact staging) belong to the server: a child
    # that removed them at exit (atexit or finalizer) would leave the next one without
    for folder in shared_folders:
        atexit.unregister(folder.cleanup)
        folder._finalizer.detach()
    argv = request["argv"]
    code = 0
    try:
        for folder in set(_python_path(request["env"], request["cwd"])) - started:
            if _fork_safe(folder):  # what a new interpreter's site module would have imported first
                runpy.run_path(os.path.join(folder, "sitecustomize.py"), run_name="sitecustomize")
        if argv[0] == "-m":
            sys.path[0] = os.getcwd()
            sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's file in argv[0]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(argv[0])
            sys.path[0] = os.path.dirname(script)
            sys.argv = list(argv)
            runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:  # as the interpreter reads it: None is 0, an int is the status, else printed and 1
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException as error:  # noqa: BLE001 - an uncaught exception: the traceback, then status 1
        trace = error.__traceback__  # from the script's first frame on, as a new interpreter prints it
        while trace is not None and trace.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>"):
            trace = trace.tb_next
        sys.excepthook(type(error), error.with_traceback(trace), trace)  # the hook prints the exception's own
        code = -signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1
    _finish(code)


def _finish(code: int) -> None:
    """What the interpreter does at exit (wait for threads, atexit handlers such as W&B's flush and logging's close,
    flush stdio), without tearing down the preloaded modules object by object: that teardown touches every shared
    page and takes ~5 s, and a script's output does not depend on it."""

    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if code == -signal.SIGINT:  # an uncaught KeyboardInterrupt ends the process by SIGINT, as Python does
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


def _server_main(path: str) -> None:
    import importlib
    import logging

    # Lightning and torchmetrics give their loggers a console handler of their own (and stop propagation) when they
    # are imported before the root logger has a handler. The entry points import them only after Hydra configured
    # logging (Lightning is imported lazily), so their lines reach the run's train.log: preload them that way too.
    placeholder = logging.NullHandler()
    logging.getLogger().addHandler(placeholder)
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - optional: the command imports it itself
            pass
    logging.getLogger().removeHandler(placeholder)
    if threading.active_count() != 1:  # forking a process with threads can deadlock the child
        print(f"not ready: {threading.active_count()} threads after preloading", flush=True)
        return
    import gc

    shared_folders = [o for o in gc.get_objects() if isinstance(o, tempfile.TemporaryDirectory)]
    gc.freeze()  # the children's collections skip the preloaded objects (and so do not copy their pages)
    request = _serve(path)
    _become(request, shared_folders)


# --------------------------------------------------------------------------------------------------------- client

class _Server:
    def __init__(self):
        self.lock = threading.Lock()
        self.path: str | None = None
        self.proc: subprocess.Popen | None = None
        self.env: dict[str, str] = {}
        self.preloaded_env: dict[str, str] = {}  # the start-up variables after preloading (see serves)
        self.cwd = os.getcwd()
        self.served = 0  # commands run through the server (the tests of this module check it is used)
        self.failed = os.environ.get("ATTNLAB_TEST_FRESH_PROCESSES") == "1"

    def start(self) -> bool:
        if self.proc is not None or self.failed:
            return not self.failed
        folder = tempfile.mkdtemp(prefix="preloaded-")
        self.path = os.path.join(folder, "socket")
        self.env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
        self.env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen([sys.executable, __file__, self.path], env=self.env, cwd=self.cwd,
                                     stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        atexit.register(self.stop, folder)
        word, _, loaded = self.proc.stdout.readline().partition(" ")
        if word != "ready":
            self.failed = True
            self.proc.kill()
        else:
            self.preloaded_env = json.loads(loaded)
        return not self.failed

    def stop(self, folder: str) -> None:
        import shutil

        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(folder, ignore_errors=True)

    def serves(self, args, env: dict[str, str], cwd: str) -> bool:
        if not (len(args) >= 2 and args[0] == sys.executable and (args[1].endswith(".py") or args[1] == "-m")):
            return False
        if not self.start():
            return False
        added = set(_python_path(env, cwd)) - set(_python_path(self.env, self.cwd))
        # the variables the server started with, each the same; and any other only as the server's preloading set
        # it (torch, sklearn and threadpoolctl set some at import, with setdefault; so does this process when a
        # test imports them)
        started, startup = _startup_env(self.env), _startup_env(env)
        same = all(startup.get(k) == v for k, v in started.items()) and all(
            self.preloaded_env.get(k) == v for k, v in startup.items() if k not in started)
        return same and not any(_runs_at_start(f) for f in added)

    def run(self, argv: list[str], cwd: str, env: dict[str, str], stdin: str, stdout: str, stderr: str,
            timeout: float | None) -> tuple[int, bool]:
        request = {"argv": argv, "cwd": cwd, "env": env, "stdin": stdin, "stdout": stdout, "stderr": stderr,
                   "timeout": timeout, "server_env": self.env, "server_cwd": self.cwd}
        self.served += 1
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(self.path)
            conn.sendall((json.dumps(request) + "\n").encode())
            reply = json.loads(conn.makefile("r").readline())
        return os.waitstatus_to_exitcode(reply["status"]), reply["timed_out"]


_SERVER = _Server()


def run(args: list[str], *, cwd=None, env=None, input=None, timeout=None, capture_output=False, stdout=None,
        stderr=None, text=None, check=False, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run`` for ``[sys.executable, script.py | -m module, *args]``, through the preloaded server when
    it can reproduce the command exactly (see the module docstring), else a real ``subprocess.run``."""
    env = {k: os.fspath(v) for k, v in (os.environ if env is None else env).items()}  # (a Path, as subprocess takes)
    merged = stderr == subprocess.STDOUT
    captured = capture_output or (stdout == subprocess.PIPE and stderr in (subprocess.PIPE, subprocess.STDOUT))
    text = text or kwargs.get("universal_newlines") or kwargs.get("encoding") is not None
    plain = set(kwargs) <= {"universal_newlines", "encoding"}
    cwd = str(cwd or os.getcwd())
    if not (captured and plain and _SERVER.serves(list(map(str, args)), env, cwd)) or not _SERVER.lock.acquire(False):
        return subprocess.run(args, cwd=cwd, env=env, input=input, timeout=timeout, capture_output=capture_output,
                              stdout=stdout, stderr=stderr, text=text, check=check, **kwargs)
    try:
        with tempfile.TemporaryDirectory(prefix="preloaded-run-") as folder:
            files = {name: os.path.join(folder, name) for name in ("stdin", "stdout", "stderr")}
            data = input if input is not None else ""
            Path(files["stdin"]).write_bytes(data.encode() if isinstance(data, str) else data)
            for name in ("stdout", "stderr"):
                Path(files[name]).touch()
            code, timed_out = _SERVER.run([str(a) for a in args[1:]], cwd, env, files["stdin"],
                                          files["stdout"], files["stdout" if merged else "stderr"], timeout)
            read = (lambda p: Path(p).read_text(errors="replace")) if text else (lambda p: Path(p).read_bytes())
            out, err = read(files["stdout"]), None if merged else read(files["stderr"])
    finally:
        _SERVER.lock.release()
    if timed_out:
        raise subprocess.TimeoutExpired(args, timeout, output=out, stderr=err)
    done = subprocess.CompletedProcess(args, code, out, err)
    if check:
        done.check_returncode()
    return done


if __name__ == "__main__":
    _server_main(sys.argv[1])
