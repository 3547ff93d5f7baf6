"""Benchmark: draguard's CEL engine (cel-expr-python + webhook/cel) against Kubernetes' (cel-go).

Both engines compile and evaluate the same typical DRA selectors on the same device in this run:
draguard through `webhook.cel.env`, Kubernetes through tools/celoracle's `-bench` mode (the API
server's compile with cost estimation, the scheduler's DeviceMatches). Prints per-selector compile
time and per-device evaluation time and the ratio draguard / Kubernetes. Targets for draguard:
compile <= 1 ms for a typical selector, evaluation <= 20 us per device.

    .venv/bin/python bench/cel_engines.py
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.cel.corpus import DEVICES, oracle_device  # noqa: E402
from webhook.cel import env as cel_env  # noqa: E402

SELECTORS = (
    "device.driver == 'gpu.nvidia.com'",
    "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'",
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu' && "
    "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
    "device.attributes['gpu.nvidia.com'].driverVersion.isGreaterThan(semver('550.0.0'))",
    "device.attributes['gpu.nvidia.com'].productName.matches('^NVIDIA (A|H)100')",
    "'gpu.nvidia.com' in device.attributes && device.attributes['gpu.nvidia.com'].exists(k, k == 'uuid')",
    "device.attributes['gpu.nvidia.com'].cudaComputeCapability.major() >= 9 && "
    "device.attributes['gpu.nvidia.com'].index < 4.0",
)


def _oracle_binary() -> Path | None:
    script = str(ROOT / "scripts" / "build-tools.sh")
    path = Path(subprocess.run(["bash", script, "--path", "celoracle"], check=True, capture_output=True,
                               text=True).stdout.strip())
    if not path.is_file() and (shutil.which("go") is None
                               or subprocess.run(["bash", script, "celoracle"], check=False).returncode != 0):
        return None
    return path


def kubernetes_times(binary: Path, device_index: int) -> list[tuple[float, float]]:
    device = DEVICES[device_index]
    lines = [json.dumps({"id": i, "selector": s, "driver": device.driver, "device": oracle_device(device)})
             for i, s in enumerate(SELECTORS)]
    res = subprocess.run([str(binary), "-bench"], input="\n".join(lines) + "\n",
                         capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    return [(float(r["compile_us"]), float(r["eval_us"])) for r in rows]


def draguard_times(device_index: int) -> list[tuple[float, float, float]]:
    """(compile us, evaluate us incl. building the device variable, runtime-only us) per selector."""
    device = DEVICES[device_index]
    out = []
    for selector in SELECTORS:
        compiles = 50
        start = time.perf_counter()
        for _ in range(compiles):
            cel_env.clear_cache()
            compiled = cel_env.compile_selector(selector)
        compile_us = (time.perf_counter() - start) / compiles * 1e6
        rounds = 5000
        start = time.perf_counter()
        for _ in range(rounds):
            compiled.evaluate(device)
        eval_us = (time.perf_counter() - start) / rounds * 1e6
        data = compiled.device_data(device)
        start = time.perf_counter()
        for _ in range(rounds):
            compiled.evaluate_data(data)
        runtime_us = (time.perf_counter() - start) / rounds * 1e6
        out.append((compile_us, eval_us, runtime_us))
    return out


def main() -> int:
    device_index = 0
    binary = _oracle_binary()
    if binary is None:
        print("skipped: tools/celoracle cannot be built here (needs Go >= 1.26; scripts/build-tools.sh)")
        return 3
    cel_env.compile_selector("true")  # build the environment once, outside the timings
    k8s = kubernetes_times(binary, device_index)
    ours = draguard_times(device_index)
    print(f"device: {DEVICES[device_index].name}; times in microseconds")
    print(f"{'selector':<60} {'compile dg':>10} {'compile k8s':>11} {'eval dg':>8} {'runtime dg':>10} "
          f"{'eval k8s':>8}")
    for selector, (kc, ke), (dc, de, dr) in zip(SELECTORS, k8s, ours, strict=True):
        short = selector if len(selector) <= 58 else selector[:55] + "..."
        print(f"{short:<60} {dc:>10.1f} {kc:>11.1f} {de:>8.2f} {dr:>10.2f} {ke:>8.2f}")
    dc_med = statistics.median(o[0] for o in ours)
    kc_med = statistics.median(k[0] for k in k8s)
    de_med = statistics.median(o[1] for o in ours)
    ke_med = statistics.median(k[1] for k in k8s)
    print(f"median compile: draguard {dc_med:.0f} us, Kubernetes {kc_med:.0f} us, "
          f"ratio {dc_med / kc_med:.2f}")
    print(f"median evaluation per device: draguard {de_med:.2f} us, Kubernetes {ke_med:.2f} us, "
          f"ratio {de_med / ke_med:.2f}")
    ok = dc_med <= 1000 and de_med <= 20
    print("targets (compile <= 1 ms, evaluation <= 20 us):", "met" if ok else "NOT met")
    return 0 if ok else 2


if __name__ == "__main__":
    raise SystemExit(main())
