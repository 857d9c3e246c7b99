"""The connector's NATS link: outcomes and donor lifecycle out, router hints in. Never blocks the scheduler.

Enabled with ``SEMBLEND_CONNECTOR_NATS=1``. A daemon thread owns an asyncio loop and a nats-py connection to
``SEMBLEND_NATS_URL``; the scheduler and the worker of one process share one link and only ``put_nowait`` into its
bounded queue (``SEMBLEND_EVIDENCE_QUEUE_SIZE``; overflow is counted in :attr:`OutcomeLink.dropped`). Messages wait in
the queue until the connection is up. Hints arriving on this
worker's hint subject go to the :class:`~trtllm_connector.hints.HintInbox`. If NATS is down, messages are dropped
and counted; serving never waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections import Counter
from typing import Any

from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.events.codec import encode
from semblend_dynamo.events.schemas import DonorLifecycle, OutcomeReport, SemblendEvent
from semblend_dynamo.events.subjects import Subjects
from semblend_dynamo.outcomes import DeclineReason, Outcome

from .donors import Donor
from .hints import HintInbox

logger = logging.getLogger(__name__)

POLL_S = 0.005


class OutcomeLink:
    """Publishes :class:`OutcomeReport` / :class:`DonorLifecycle` and feeds hints into an inbox."""

    def __init__(self, cfg: SemblendConfig, hints: HintInbox | None, deployment: str) -> None:
        self.cfg = cfg
        self.hints = hints
        self.deployment = deployment
        self.subjects = Subjects.for_config(cfg)
        self.dropped: Counter[str] = Counter()
        self.published = 0
        self.connected = threading.Event()
        self._closing = threading.Event()
        self._queue: queue.Queue[tuple[str, SemblendEvent] | None] = queue.Queue(cfg.evidence_queue_size)
        self._sequence = 0
        self._thread = threading.Thread(target=self._run, name="semblend-connector-nats", daemon=True)

    @classmethod
    def start(cls, cfg: SemblendConfig, hints: HintInbox | None, deployment: str) -> OutcomeLink:
        link = cls(cfg, hints, deployment)
        link._thread.start()
        return link

    # --- called from the connector (any thread; never blocks) -------------------------------------
    def outcome(
        self,
        request_id: str,
        namespace: str,
        outcome: Outcome,
        *,
        key: str,
        reason: DeclineReason | None = None,
        tokens: int = 0,
        donor_id: str | None = None,
    ) -> None:
        report = OutcomeReport(
            request_id=request_id,
            request_key=key,
            worker_id=self.cfg.worker_id,
            deployment=self.deployment,
            namespace=namespace or self.deployment,
            outcome=outcome,
            materialized_tokens=tokens,
            rejection_reason=reason,
            donor_id=donor_id,
        )
        self._offer(self.subjects.outcomes, report)

    def lifecycle(self, donor: Donor, event: str) -> None:
        message = DonorLifecycle(
            donor_id=donor.donor_id,
            worker_id=self.cfg.worker_id,
            deployment=self.deployment,
            namespace=donor.namespace_digest,
            event=event,  # type: ignore[arg-type]
            generation=abs(donor.generation),
        )
        self._offer(self.subjects.donors, message)

    def close(self, timeout: float = 5.0) -> None:
        """Flush what is queued (up to ``timeout``) and stop the thread."""
        self._closing.set()
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout)
        self._thread.join(timeout)

    def _offer(self, subject: str, message: SemblendEvent) -> None:
        try:
            self._queue.put_nowait((subject, message))
        except queue.Full:
            self.dropped["queue_full"] += 1

    # --- the link's own thread ----------------------------------------------------------------------
    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        connecting = asyncio.create_task(self._connect())
        while True:
            if not self.connected.is_set() and not self._closing.is_set():
                await asyncio.sleep(POLL_S)  # hold messages until connected; overflow is counted as queue_full
                continue
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                # Polling keeps this a daemon thread with no executor threads for interpreter exit to join.
                await asyncio.sleep(POLL_S)
                continue
            if item is None:
                break
            nc = connecting.result() if connecting.done() and connecting.exception() is None else None
            if nc is None:
                self.dropped["no_connection"] += 1
                continue
            subject, message = item
            self._sequence += 1
            try:
                await nc.publish(subject, encode(message, publisher_id=self.cfg.worker_id, sequence=self._sequence))
                self.published += 1
            except Exception:
                self.dropped["publish_failed"] += 1
        if connecting.done() and connecting.exception() is None:
            with contextlib.suppress(Exception):
                await connecting.result().drain()
        else:
            connecting.cancel()

    async def _connect(self) -> Any:
        """Connect (retrying for as long as it takes) and subscribe to this worker's hints."""
        import nats

        options: dict[str, Any] = {"servers": [self.cfg.nats_url], "max_reconnect_attempts": -1}
        if self.cfg.nats_user:
            options.update(user=self.cfg.nats_user, password=self.cfg.nats_password)
        if self.cfg.nats_token:
            options["token"] = self.cfg.nats_token
        if self.cfg.nats_creds_file:
            options["user_credentials"] = self.cfg.nats_creds_file

        async def quiet(exc: Exception) -> None:
            logger.debug("semblend connector NATS: %s", exc)

        while True:
            try:
                nc = await nats.connect(**options, error_cb=quiet)
                break
            except Exception as exc:
                logger.warning("semblend connector: NATS unavailable (%s); outcomes are dropped meanwhile", exc)
                await asyncio.sleep(1.0)
        if self.hints is not None:
            inbox = self.hints

            async def on_hint(msg: Any) -> None:
                inbox.submit_bytes(msg.data)

            await nc.subscribe(self.subjects.hints(self.cfg.worker_id), cb=on_hint)
        await nc.flush()
        self.connected.set()
        return nc
