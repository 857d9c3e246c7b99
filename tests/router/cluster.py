"""Process harness for the router integration tests: nats-server, test workers, routers, the test client.

Everything binds 127.0.0.1; Dynamo discovery is a per-cluster ``DYN_FILE_KV`` directory. Processes are
stopped by the PIDs this harness started.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import nats

from tests.support.dynamo_graph import write_model_dir
from tests.support.dynamo_test_worker import control_subject
from tests.support.nats import NatsServer, free_port
from tests.support.processes import stop_process

ROOT = Path(__file__).resolve().parents[2]
BLOCK = 16


class Proc:
    """A child process whose stdout is read line by line in a thread."""

    def __init__(self, cmd: list[str], env: dict[str, str], log_path: Path, ready_prefix: str | None) -> None:
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=self._log, text=True)
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.ready_line = self._wait_for(ready_prefix, timeout=60) if ready_prefix else ""

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()
            self._lines.put(line)

    def _wait_for(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"{self.proc.args} exited {self.proc.returncode}; see {self.log_path} (kept with SEMBLEND_KEEP_TEST_LOGS=1)"
                    ) from None
                continue
            if line.startswith(prefix):
                return line.strip()
        raise RuntimeError(
            f"{self.proc.args} not ready in {timeout}s; see {self.log_path} (kept with SEMBLEND_KEEP_TEST_LOGS=1)"
        )

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()


class Cluster:
    """One nats-server plus the Dynamo processes of a test module."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="semblend-router-test-"))
        (self.dir / "filekv").mkdir()
        self.model_dir = write_model_dir(self.dir / "model")
        self.nats = NatsServer().start()
        self.namespace = f"t{os.getpid()}"
        self.procs: list[Proc] = []
        self.env = dict(os.environ)
        self.env.update(
            {
                "NATS_SERVER": self.nats.url,
                "DYN_EVENT_PLANE": "nats",
                "DYN_DISCOVERY_BACKEND": "file",
                "DYN_FILE_KV": str(self.dir / "filekv"),
                "DYN_REQUEST_PLANE": "tcp",
                "DYN_TCP_RPC_HOST": "127.0.0.1",
                "DYN_SYSTEM_HOST": "127.0.0.1",
                "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
                "HF_HUB_OFFLINE": "1",
                "HOME": str(self.dir),
                "DYN_LOG": "warn",
                "PYTHONPATH": str(ROOT),
                "SEMBLEND_NATS_URL": self.nats.url,
                "SEMBLEND_DYNAMO_NAMESPACE": self.namespace,
                "SEMBLEND_WORKER_COMPONENT": "backend",
                "SEMBLEND_MODEL_ID": "test-model",
                "SEMBLEND_BLOCK_SIZE": str(BLOCK),
                "SEMBLEND_EMBEDDER": "hash",
                "SEMBLEND_MIN_DONOR_TOKENS": "64",
                "SEMBLEND_MIN_SPAN_TOKENS": "32",
                "SEMBLEND_METRICS_HOST": "127.0.0.1",
            }
        )

    # --- processes -------------------------------------------------------------------------------
    def start_worker(self, name: str, capacity_blocks: int = 4096) -> TestWorkerHandle:
        record = self.dir / f"{name}.jsonl"
        record.touch()
        cmd = [sys.executable, "-m", "tests.support.dynamo_test_worker", "--name", name, "--namespace", self.namespace]
        cmd += ["--block-size", str(BLOCK), "--capacity-blocks", str(capacity_blocks), "--record", str(record)]
        proc = Proc(cmd, self.env, self.dir / f"{name}.log", "READY")
        self.procs.append(proc)
        return TestWorkerHandle(self, name, int(proc.ready_line.split()[1]), record, proc)

    def start_mocker(self, name: str, gpu_blocks: int = 4096) -> MockerHandle:
        """A stock ``dynamo.mocker --engine-type trtllm`` worker (Dynamo's engine emulation and KV publisher)."""
        before = self.instances()
        cmd = [sys.executable, "-m", "dynamo.mocker", "--model-path", str(self.model_dir), "--model-name", "test-model"]
        cmd += ["--engine-type", "trtllm", "--block-size", str(BLOCK), "--num-gpu-blocks-override", str(gpu_blocks)]
        cmd += ["--enable-prefix-caching", "--speedup-ratio", "100"]
        cmd += ["--endpoint", f"dyn://{self.namespace}.backend.generate"]
        proc = Proc(cmd, self.env, self.dir / f"{name}.log", None)
        self.procs.append(proc)
        new = wait_until(lambda: self.instances() - before, timeout=30)
        return MockerHandle(name, next(iter(new)), proc)

    def instances(self) -> set[int]:
        """Live worker instance ids, from the file discovery directory."""
        folder = self.dir / "filekv" / "v1" / "instances"
        prefix = f"{self.namespace}/backend/generate/"
        names = [unquote(p.name) for p in folder.iterdir()] if folder.is_dir() else []
        return {int(n[len(prefix) :], 16) for n in names if n.startswith(prefix)}

    def start_router(self, name: str, **settings: str) -> RouterHandle:
        env = dict(self.env, SEMBLEND_METRICS_PORT=str(free_port()))
        env.update({f"SEMBLEND_{k.upper()}": v for k, v in settings.items()})
        cmd = [sys.executable, "-m", "semblend_dynamo.router", "--log-level", "INFO"]
        proc = Proc(cmd, env, self.dir / f"{name}.log", "SEMBLEND_ROUTER_READY")
        self.procs.append(proc)
        _, instance, port = proc.ready_line.split()
        return RouterHandle(int(instance), int(port), proc)

    def send(
        self, requests: list[dict[str, Any]], *, interval_s: float = 0.0, instance: int = 0
    ) -> list[dict[str, Any]]:
        """Send requests through the router endpoint with the test client; one result per request."""
        stamp = f"{time.monotonic_ns()}"
        req_path, out_path = self.dir / f"req-{stamp}.json", self.dir / f"out-{stamp}.jsonl"
        req_path.write_text(json.dumps(requests))
        cmd = [sys.executable, "-m", "tests.router.router_client", "--endpoint", f"{self.namespace}.semblend.generate"]
        cmd += ["--requests", str(req_path), "--out", str(out_path), "--interval-s", str(interval_s)]
        if instance:
            cmd += ["--instance", str(instance)]
        with open(self.dir / f"client-{stamp}.log", "w") as log:
            subprocess.run(cmd, env=self.env, cwd=ROOT, stdout=log, stderr=log, timeout=120, check=False)
        return [json.loads(line) for line in out_path.read_text().splitlines()] if out_path.exists() else []

    def nats_request(self, subject: str, payload: dict[str, Any]) -> dict[str, Any]:
        async def go() -> dict[str, Any]:
            nc = await nats.connect(self.nats.url)
            try:
                msg = await nc.request(subject, json.dumps(payload).encode(), timeout=10)
                return dict(json.loads(msg.data))
            finally:
                await nc.close()

        return asyncio.run(go())

    def publish_raw(self, messages: list[tuple[str, bytes]]) -> None:
        async def go() -> None:
            nc = await nats.connect(self.nats.url)
            for i, (subject, data) in enumerate(messages):
                await nc.publish(subject, data)
                if i % 500 == 499:
                    await nc.flush()
            await nc.flush()
            await nc.close()

        asyncio.run(go())

    def subject(self, topic: str) -> str:
        return f"namespace.{self.namespace}.component.backend.endpoint.generate.{topic}"

    def close(self) -> None:
        """Stop everything; the logs directory is removed unless SEMBLEND_KEEP_TEST_LOGS=1."""
        for proc in reversed(self.procs):
            proc.stop()
        self.nats.stop()
        if os.environ.get("SEMBLEND_KEEP_TEST_LOGS") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)
            shutil.rmtree(self.nats.store, ignore_errors=True)


class TestWorkerHandle:
    """A running test worker: its Dynamo worker id and what it received."""

    __test__ = False

    def __init__(self, cluster: Cluster, name: str, worker_id: int, record: Path, proc: Proc) -> None:
        self.cluster = cluster
        self.name = name
        self.worker_id = worker_id
        self.record = record
        self.proc = proc

    def received(self) -> list[dict[str, Any]]:
        """The requests the worker served, in order."""
        return [r["request"] for r in self._records() if "request" in r]

    def hints(self) -> list[dict[str, Any]]:
        """The router hints that arrived on the worker's NATS hint subject, in order."""
        return [r["hint"] for r in self._records() if "hint" in r]

    def _records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    def command(self, cmd: str, **fields: Any) -> dict[str, Any]:
        return self.cluster.nats_request(control_subject(self.name), {"cmd": cmd, **fields})


class MockerHandle:
    """A running ``dynamo.mocker`` worker and its Dynamo worker id."""

    def __init__(self, name: str, worker_id: int, proc: Proc) -> None:
        self.name = name
        self.worker_id = worker_id
        self.proc = proc


class RouterHandle:
    """A running router: its Dynamo instance id and HTTP side door."""

    def __init__(self, instance: int, port: int, proc: Proc) -> None:
        self.instance = instance
        self.port = port
        self.proc = proc

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def health(self) -> dict[str, Any]:
        return dict(json.loads(self.get("/healthz")[1]))

    def donors(self) -> list[dict[str, Any]]:
        return list(json.loads(self.get("/debug/donors")[1]))

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels``."""
        total = 0.0
        for line in self.get("/metrics")[1].splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            head, value = line.rsplit(" ", 1)
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                total += float(value)
        return total


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.1) -> Any:
    """Poll ``predicate`` until it returns something truthy; AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


RNG = random.Random(20261121)


def chunk(n: int) -> list[int]:
    """``n`` random token ids (one shared generator, so a module's prompts never repeat by chance)."""
    return [RNG.randrange(100, 7000) for _ in range(n)]


class Rag:
    """A retrieval-augmented prompt family: system prompt + documents + question, reorderable."""

    def __init__(self) -> None:
        self.docs = [chunk(128) for _ in range(3)]
        self.question = chunk(32)

    def prompt(self, order: tuple[int, ...], system: list[int]) -> list[int]:
        return system + [t for i in order for t in self.docs[i]] + self.question


def request_for(tokens: list[int], tenant: str | None = None) -> dict[str, Any]:
    """A PreprocessedRequest as the stock Frontend sends it (the salt rides in ``extra_args.nvext.cache_salt``)."""
    request: dict[str, Any] = {"token_ids": tokens, "stop_conditions": {"max_tokens": 2}}
    if tenant is not None:
        request["extra_args"] = {"nvext": {"cache_salt": tenant}}
    return request


def serve_donor(cluster: Cluster, router: RouterHandle, tokens: list[int], tenant: str | None = None) -> int:
    """Send a prompt through the router and wait until it is a resident donor; returns the serving worker."""
    before = {d["donor_id"] for d in router.donors()}
    (result,) = cluster.send([request_for(tokens, tenant)])
    assert result["ok"], result
    worker_id = int(result["worker_id"])
    wait_until(lambda: any(d["resident"] and d["donor_id"] not in before for d in router.donors()))
    wait_until(
        lambda: router.metric("semblend_router_indexer_backlog") == 0
    )  # the pipeline follows on the indexer thread
    return worker_id
