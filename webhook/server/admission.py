"""AdmissionReview in, AdmissionReview out: the protocol around the engine.

No I/O here: the caller hands in a `Snapshot` of what the caches know and gets an `Outcome`
(the response document plus what to count, log, and create). The verdict is the engine's; this
module only maps findings onto the fields of `admission.k8s.io/v1` for the endpoint that asked.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import re
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import jsonpatch

from ..cel.env import REQUEST_COMPILE_BYTES, compile_budget
from ..core.findings import Finding, Mode, ObjectRef, Severity
from ..core.source import SourceObject
from ..dra.inventory import Inventory
from ..dra.workloads import using_crd_table
from ..engine.context import ALL_RESOURCE_VERSIONS, Context, QuotaUsage
from ..engine.rules import ENGINE_FAILURE
from . import codec

API_VERSION = "admission.k8s.io/v1"
MAX_WARNING = 120
MAX_WARNINGS = 20
MAX_MESSAGE = 3500
MAX_ANNOTATION_VALUE = 1000

POD_KINDS: frozenset[tuple[str, str]] = frozenset(
    {
        ("", "Pod"),
        ("", "PodTemplate"),
        ("", "ReplicationController"),
        ("apps", "Deployment"),
        ("apps", "ReplicaSet"),
        ("apps", "StatefulSet"),
        ("apps", "DaemonSet"),
        ("batch", "Job"),
        ("batch", "CronJob"),
    }
)
DRA_GROUP = "resource.k8s.io"
DRA_KINDS: frozenset[str] = frozenset({"ResourceClaim", "ResourceClaimTemplate", "DeviceClass"})
CHECKED_OPERATIONS = frozenset({"CREATE", "UPDATE"})

Endpoint = str  # "validate" | "mutate"


class ReviewError(Exception):
    """A request that is not a usable AdmissionReview; answered with HTTP `status`, never evaluated."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason  # short metric label
        self.message = message


@dataclass(frozen=True)
class Snapshot:
    """Everything the request path reads, swapped as a whole when policies or caches change."""

    policies: Any  # PolicySet
    inventory: Inventory = field(default_factory=Inventory.empty)
    namespace_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    usage: QuotaUsage | None = None
    served_versions: frozenset[str] = ALL_RESOURCE_VERSIONS
    # Existing ResourceClaimTemplates: (namespace, name) -> object (to reuse generated ones).
    templates: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    generation: int = 0


@dataclass
class Outcome:
    """What one review produced."""

    response: dict[str, Any]
    kind: str
    operation: str
    verdict: str  # allowed | denied | warned | patched | ignored | error
    findings: list[Finding] = field(default_factory=list)
    internal_rules: list[str] = field(default_factory=list)
    # Objects the patch depends on (mutate only); the caller creates them or drops the patch.
    generated: tuple[dict[str, Any], ...] = ()
    patch: list[dict[str, Any]] | None = None
    dry_run: bool = False
    namespace: str = ""
    name: str = ""
    cel_bytes: int = 0  # never-seen selector text compiled for this review
    cel_limited: bool = False  # the CEL budget left some selector unchecked

    @property
    def uid(self) -> str:
        return str(self.response.get("uid", ""))

    def document(self) -> dict[str, Any]:
        return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": self.response}


def parse_review(body: bytes) -> dict[str, Any]:
    """The `request` of an AdmissionReview v1 body, or ReviewError(400) saying what is wrong."""
    try:
        doc = codec.loads(body)
    except RecursionError as e:  # a hostile body must not become a 500
        raise ReviewError(400, "too-deep", "request body nests too deeply to be an AdmissionReview") from e
    except (UnicodeDecodeError, ValueError) as e:
        if codec.is_too_deep(e):
            raise ReviewError(
                400, "too-deep", "request body nests too deeply to be an AdmissionReview"
            ) from e
        raise ReviewError(400, "malformed-json", f"request body is not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ReviewError(400, "not-a-review", "request body must be a JSON object (an AdmissionReview)")
    api = doc.get("apiVersion")
    if api != API_VERSION:
        raise ReviewError(
            400,
            "unsupported-version",
            f"apiVersion {api!r} is not supported: draguard accepts only {API_VERSION} AdmissionReview "
            '(set admissionReviewVersions: ["v1"] in the webhook configuration)',
        )
    if doc.get("kind") != "AdmissionReview":
        raise ReviewError(400, "not-a-review", f"kind must be AdmissionReview, got {doc.get('kind')!r}")
    req = doc.get("request")
    if not isinstance(req, dict):
        raise ReviewError(400, "missing-request", "AdmissionReview has no request object")
    uid = req.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError(400, "missing-uid", "AdmissionReview request.uid is missing or not a string")
    return req


def _kind_of(req: Mapping[str, Any]) -> tuple[str, str, str]:
    k = req.get("kind")
    if not isinstance(k, Mapping):
        return "", "", ""
    return str(k.get("group") or ""), str(k.get("version") or ""), str(k.get("kind") or "")


def is_checked(group: str, version: str, kind: str) -> bool:
    if (group, kind) in POD_KINDS or is_workload_crd(group, kind):
        return True
    return group == DRA_GROUP and kind in DRA_KINDS and version in ALL_RESOURCE_VERSIONS


def is_workload_crd(group: str, kind: str) -> bool:
    """A workload CRD whose pod templates draguard knows (the table in force: built-in plus
    WorkloadKindPolicy documents, see webhook/dra/workloads.py)."""
    from ..dra.workloads import is_workload_crd as known

    return known(group, kind)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def warning_text(f: Finding) -> str:
    """One warning line, at most 120 characters (longer ones are truncated by clients)."""
    text = _one_line(f"draguard [{f.rule}] {f.message}")
    return text if len(text) <= MAX_WARNING else text[: MAX_WARNING - 3] + "..."


_KEY_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


def annotation_key(rule: str) -> str:
    """A qualified-name key (the API server prefixes it with the webhook name)."""
    key = _KEY_BAD.sub("-", rule.replace("/", ".")).strip("-_.")[:63].rstrip("-_.")
    return key or "finding"


def deny_message(obj: ObjectRef | None, findings: Sequence[Finding]) -> str:
    what = str(obj) if obj else "the object"
    parts = []
    for f in findings:
        part = f"[{f.rule}] {_one_line(f.message)}"
        if f.fix:
            part += f" Fix: {_one_line(f.fix)}"
        parts.append(part)
    rules = ", ".join(dict.fromkeys(f.rule for f in findings))
    msg = f"draguard denied {what} ({rules}): " + " | ".join(parts)
    return msg if len(msg) <= MAX_MESSAGE else msg[: MAX_MESSAGE - 3] + "..."


def _ref(obj: Mapping[str, Any], kind: str, namespace: str, name: str) -> ObjectRef:
    return ObjectRef(str(obj.get("apiVersion") or ""), kind, namespace or None, name)


def prepare_object(req: Mapping[str, Any], group: str, version: str, kind: str) -> dict[str, Any] | None:
    """The object as the engine wants it: apiVersion/kind and namespace filled in, managedFields
    left out (shallow copies)."""
    raw = req.get("object")
    if not isinstance(raw, dict):
        return None
    obj = dict(raw)
    if not obj.get("apiVersion"):
        obj["apiVersion"] = f"{group}/{version}" if group else version
    if not obj.get("kind"):
        obj["kind"] = kind
    ns = req.get("namespace")
    meta = obj.get("metadata")
    meta = dict(meta) if isinstance(meta, dict) else {}
    # No rule reads who wrote which field, and the caches and the audit drop it too: an API server's
    # object carries it on every request, and the depth check would walk it each time.
    meta.pop("managedFields", None)
    if isinstance(ns, str) and ns and not meta.get("namespace") and kind != "DeviceClass":
        meta["namespace"] = ns
    if not meta.get("name"):
        # Pods of a ReplicaSet arrive with generateName only; name them for messages.
        gen = meta.get("generateName") or req.get("name") or ""
        if gen:
            meta["name"] = str(gen) if req.get("name") else f"{gen}<generated>"
    obj["metadata"] = meta
    return obj


def combine_patches(
    original: Mapping[str, Any], findings: Sequence[Finding]
) -> tuple[list[dict[str, Any]], list[Finding], list[Finding]]:
    """Concatenate the findings' patches, keeping only those that still apply in sequence.

    Returns (operations, applied findings, dropped findings). Applying here also proves the patch
    is valid against the object as sent, so the API server never gets one it cannot apply.
    """
    ops: list[dict[str, Any]] = []
    applied: list[Finding] = []
    dropped: list[Finding] = []
    current: Any = original
    for f in findings:
        if not f.patch:
            continue
        try:
            current = jsonpatch.apply_patch(current, f.patch, in_place=False)
        except (
            jsonpatch.JsonPatchException,
            jsonpatch.JsonPointerException,
            TypeError,
            KeyError,
            IndexError,
        ):
            dropped.append(f)
            continue
        ops.extend(f.patch)
        applied.append(f)
    return ops, applied, dropped


_DAY: list[tuple[float, float, dt.date]] = []  # (local start, local end, the day)


def _today() -> dt.date:
    """`date.today()`, worked out once per local day (Context's own default costs more per request)."""
    now = time.time()
    day = _DAY[0] if _DAY else None
    if day is not None and day[0] <= now < day[1]:
        return day[2]
    today = dt.date.fromtimestamp(now)
    start = dt.datetime.combine(today, dt.time()).timestamp()
    end = dt.datetime.combine(today + dt.timedelta(days=1), dt.time()).timestamp()
    _DAY[:] = [(start, end, today)]
    return today


def _evaluate(
    obj: dict[str, Any],
    snap: Snapshot,
    operation: str,
    namespace: str,
    cel_bytes: int | None = None,
    lookups: Any = None,
) -> tuple[list[Finding], int, bool]:
    """Findings, the bytes of never-seen selector text compiled on the way, and whether the CEL
    budget refused something (the findings are then incomplete)."""
    from ..engine.evaluate import evaluate

    ctx = Context(
        namespace_labels=snap.namespace_labels,
        usage=snap.usage,
        served_versions=snap.served_versions,
        default_namespace=namespace or "default",
        today=_today(),
        operation=operation,  # type: ignore[arg-type]
        admission=True,
        # What webhook.server.lookups read from the API server for this request, if anything.
        related=tuple(lookups.related) if lookups else (),
        looked_up=dict(lookups.looked_up) if lookups else {},
    )
    # Selector text is the caller's: one request compiles a bounded amount of it.
    limit = REQUEST_COMPILE_BYTES if cel_bytes is None else min(cel_bytes, REQUEST_COMPILE_BYTES)
    with compile_budget(limit) as budget:
        report = evaluate([SourceObject(obj)], snap.policies, snap.inventory, ctx)
    return list(report.findings), limit - budget.left, budget.refused > 0


def review(
    endpoint: Endpoint,
    req: Mapping[str, Any],
    snap: Snapshot,
    cel_bytes: int | None = None,
    lookups: Any = None,
) -> Outcome:
    """Evaluate one AdmissionReview request for `endpoint` ("validate" or "mutate"); at most
    `cel_bytes` of never-seen CEL text are compiled (None: the per-request budget);
    `lookups` is what webhook.server.lookups read from the API server for it."""
    with using_crd_table(getattr(snap.policies, "crd_table", None)):
        out = _review(endpoint, req, snap, cel_bytes, lookups)
    if lookups and getattr(lookups, "related", ()):
        # What was read on the request's behalf decides the verdict but is never quoted in the answer:
        # the request may be forged, and the objects read are another tenant's.
        from .lookups import private_text, redact  # lookups imports this module

        out.response = redact(out.response, private_text(lookups, req, snap))
    return out


def _review(
    endpoint: Endpoint,
    req: Mapping[str, Any],
    snap: Snapshot,
    cel_bytes: int | None,
    lookups: Any,
) -> Outcome:
    uid = str(req["uid"])
    group, version, kind = _kind_of(req)
    operation = str(req.get("operation") or "")
    dry_run = bool(req.get("dryRun"))
    namespace = str(req.get("namespace") or "")
    name = str(req.get("name") or "")
    allowed: dict[str, Any] = {"uid": uid, "allowed": True}

    cel_used, cel_limited = 0, False

    def out(verdict: str, **kw: Any) -> Outcome:
        return Outcome(
            cel_bytes=cel_used,
            cel_limited=cel_limited,
            response=kw.pop("response", allowed),
            kind=kind or "unknown",
            operation=operation or "unknown",
            verdict=verdict,
            dry_run=dry_run,
            namespace=namespace,
            name=name,
            **kw,
        )

    # Subresources (pods/status, deployments/scale, ...) and deletes carry nothing draguard checks.
    if operation not in CHECKED_OPERATIONS or req.get("subResource") or not is_checked(group, version, kind):
        return out("ignored")
    obj = prepare_object(req, group, version, kind)
    if obj is None:
        return out("ignored")
    meta = obj["metadata"]
    name = name or str(meta.get("name") or "")
    ref = _ref(obj, kind, namespace, name)

    try:
        findings, cel_used, cel_limited = _evaluate(obj, snap, operation, namespace, cel_bytes, lookups)
    except Exception as e:  # the engine promises not to raise; never turn a bug into a 500
        findings = [
            Finding(
                rule=ENGINE_FAILURE,
                severity=Severity.ERROR,
                mode=Mode.ENFORCE,
                object=ref,
                message=f"draguard engine failed: {type(e).__name__}: {e}",
            )
        ]
    internal = [f for f in findings if f.rule.startswith("internal/")]
    regular = [f for f in findings if not f.rule.startswith("internal/")]
    internal_rules = list(dict.fromkeys(f.rule for f in internal))

    if endpoint == "mutate":
        if internal:
            # A rule failed: let the request through untouched; the validating side decides.
            return out("error", findings=internal, internal_rules=internal_rules)
        patching = [f for f in regular if f.patch]
        if not patching:
            return out("allowed")
        ops, applied, _dropped = combine_patches(req["object"], patching)
        if not ops:
            return out("allowed", findings=patching)
        resp = dict(allowed)
        resp["patchType"] = "JSONPatch"
        resp["patch"] = base64.b64encode(codec.dumps(ops)).decode()
        resp["warnings"] = [warning_text(f) for f in applied][:MAX_WARNINGS]
        generated = tuple(g for f in applied for g in f.generated)
        return out("patched", response=resp, findings=applied, generated=generated, patch=ops)

    # validate
    resp = dict(allowed)
    if internal:
        msg = (
            "draguard could not evaluate "
            + str(ref)
            + ": internal error in "
            + ", ".join(f"{f.rule} ({_one_line(f.message)})" for f in internal)
        )
        resp["allowed"] = False
        resp["status"] = {"code": 500, "reason": "InternalError", "message": msg[:MAX_MESSAGE]}
        return out("error", response=resp, findings=internal + regular, internal_rules=internal_rules)
    deny = [f for f in regular if f.mode is Mode.ENFORCE]
    warn = [f for f in regular if f.mode is Mode.WARN]
    audit = [f for f in regular if f.mode is Mode.AUDIT]
    verdict = "allowed"
    if deny:
        resp["allowed"] = False
        resp["status"] = {"code": 403, "reason": "Forbidden", "message": deny_message(ref, deny)}
        verdict = "denied"
    if warn:
        lines = [warning_text(f) for f in warn]
        if len(lines) > MAX_WARNINGS:
            lines = [*lines[: MAX_WARNINGS - 1], f"draguard: {len(lines) - MAX_WARNINGS + 1} more warnings"]
        resp["warnings"] = lines
        if verdict == "allowed":
            verdict = "warned"
    if audit:
        ann: dict[str, str] = {}
        for f in audit:
            key = annotation_key(f.rule)
            val = _one_line(f.message)
            ann[key] = f"{ann[key]}; {val}" if key in ann else val
        resp["auditAnnotations"] = {k: v[:MAX_ANNOTATION_VALUE] for k, v in ann.items()}
    return out(verdict, response=resp, findings=regular)


def without_patch(outcome: Outcome, reason: str) -> Outcome:
    """The mutate outcome with its patch withdrawn (a generated object could not be made)."""
    resp = {"uid": outcome.uid, "allowed": True}
    text = _one_line(f"draguard: not migrated: {reason}")
    resp["warnings"] = [text if len(text) <= MAX_WARNING else text[: MAX_WARNING - 3] + "..."]
    return Outcome(
        response=resp,
        kind=outcome.kind,
        operation=outcome.operation,
        verdict="allowed",
        findings=outcome.findings,
        dry_run=outcome.dry_run,
        namespace=outcome.namespace,
        name=outcome.name,
    )


_UID_SENTINEL = "\u0000draguard-uid\u0000"


@dataclass(frozen=True)
class Cached:
    outcome: Outcome
    prefix: bytes  # serialised response document around the uid
    suffix: bytes

    def render(self, uid: str) -> tuple[Outcome, bytes]:
        out = replace(self.outcome, response={**self.outcome.response, "uid": uid})
        return out, self.render_bytes(uid)

    def render_bytes(self, uid: str) -> bytes:
        return self.prefix + codec.dumps(uid) + self.suffix


def serialise(outcome: Outcome) -> bytes:
    return codec.dumps(outcome.document())


ReviewKey = tuple[str, int, str, bytes]


class ReviewCache:
    """Outcomes of identical requests (the same but for request.uid) under the same snapshot.

    What repeats, as a v1.37 API server sends it: a server-side apply that changes nothing (a
    GitOps controller's every sync) is the same UPDATE each time on either endpoint; on /mutate, a
    controller's generateName pods carry no name, uid or creationTimestamp yet, so a ReplicaSet's
    pods created in the same second (managedFields times are in seconds) are one request. A
    /validate CREATE never repeats: the API server has set the generated name, a fresh uid and
    creationTimestamp before validating admission, so `key()` gives none (never stored). The key
    covers
    everything a verdict may depend on: endpoint, the whole request but its uid (object, namespace,
    operation, userInfo, dryRun),
    the snapshot generation (policies, inventory, usage, namespace labels) and the date (exception
    expiry). A hit skips parsing and evaluation; side effects (creating generated templates) still
    run on every request.
    """

    def __init__(self, size: int = 4096, max_bytes: int = 16 * 1024 * 1024) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self.bytes = 0  # estimated: the outcome is kept beside its serialised form
        self._data: OrderedDict[ReviewKey, Cached] = OrderedDict()
        self._sizes: dict[ReviewKey, int] = {}
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(endpoint: str, request: Mapping[str, Any], generation: int) -> ReviewKey | None:
        """The request without its uid, structurally (a uid that also occurs elsewhere in the body
        changes nothing but the uid); None (never cached) for a validating CREATE, which never
        repeats (keying and storing it would only cost time and push out entries that do), and when
        it cannot be serialised again."""
        if endpoint == "validate" and request.get("operation") == "CREATE":
            return None
        rest = {k: v for k, v in request.items() if k != "uid"}
        try:
            text = codec.dumps(rest)
        except (TypeError, ValueError, RecursionError):
            return None
        digest = hashlib.blake2b(text, digest_size=16).digest()
        return endpoint, generation, _today().isoformat(), digest

    def get(self, key: ReviewKey) -> Cached | None:
        hit = self._data.get(key)
        if hit is None:
            self.misses += 1
            return None
        self._data.move_to_end(key)
        self.hits += 1
        return hit

    def put(self, key: ReviewKey, outcome: Outcome) -> Cached | None:
        """Store the outcome; returns the entry (None when not cached), whose `render_bytes(uid)`
        is the serialised response for that uid."""
        if outcome.verdict == "error" or outcome.cel_limited:
            # An internal error may be transient, and a budget refills: evaluate again next time.
            return None
        tmpl = serialise(replace(outcome, response={**outcome.response, "uid": _UID_SENTINEL}))
        prefix, _, suffix = tmpl.partition(codec.dumps(_UID_SENTINEL))
        entry = Cached(outcome, prefix, suffix)
        weight = 1024 + 3 * len(tmpl)
        if key in self._data:
            self.bytes -= self._sizes.pop(key, 0)
            del self._data[key]
        self._data[key] = entry
        self._sizes[key] = weight
        self.bytes += weight
        while self._data and (len(self._data) > self.size or self.bytes > self.max_bytes):
            old, _ = self._data.popitem(last=False)
            self.bytes -= self._sizes.pop(old, 0)
        return entry

    def __len__(self) -> int:
        return len(self._data)


class CelRate:
    """How much never-seen CEL text the server compiles: token buckets per identity and for all.

    Compiling and first matching a selector is the one request cost a caller controls (about 10 ms
    per KiB, and a pass over every device); cached text is free. Each identity refills at
    `per_identity` bytes/s up to `burst`, everyone together at `total` up to `total_burst`. A
    request gets what both buckets hold (at most the per-request budget); what it compiled is
    charged after. Text over the allowance is reported as cel/unsupported (left to the API
    server), so a flood of unique selectors costs the server little and other callers nothing.
    """

    def __init__(
        self,
        per_identity: float = 16 * 1024,
        burst: float = 32 * 1024,
        total: float = 48 * 1024,
        total_burst: float = 96 * 1024,
        max_identities: int = 4096,
        clock: Any = time.monotonic,
    ) -> None:
        self.per_identity, self.burst = per_identity, burst
        self.total, self.total_burst = total, total_burst
        self.max_identities = max_identities
        self.clock = clock
        self._all = (total_burst, clock())
        self._ident: OrderedDict[str, tuple[float, float]] = OrderedDict()

    @staticmethod
    def _refill(state: tuple[float, float], rate: float, cap: float, now: float) -> float:
        tokens, at = state
        return min(cap, tokens + max(now - at, 0.0) * rate)

    def allowance(self, scope: str) -> int:
        now = self.clock()
        mine = self._ident.get(scope)
        own = self.burst if mine is None else self._refill(mine, self.per_identity, self.burst, now)
        shared = self._all[0]
        if shared < self.total_burst:  # full (the common case) stays full
            shared = self._refill(self._all, self.total, self.total_burst, now)
        return int(max(0.0, min(own, shared, REQUEST_COMPILE_BYTES)))

    def charge(self, scope: str, used: int) -> None:
        now = self.clock()
        mine = self._ident.pop(scope, None)
        own = self.burst if mine is None else self._refill(mine, self.per_identity, self.burst, now)
        self._ident[scope] = (own - used, now)
        while len(self._ident) > self.max_identities:
            self._ident.popitem(last=False)
        self._all = (self._refill(self._all, self.total, self.total_burst, now) - used, now)
