"""Regenerate the gRPC stubs: `python -m driver.proto.generate` (needs grpcio-tools).

Runs protoc with the repository root as include path; the gRPC modules' imports of their messages
are then made relative.
"""

from __future__ import annotations

import sys
from pathlib import Path

PYI_HEADER = '# mypy: disable-error-code="type-arg"\n'
PROTOS = (
    "dra_v1.proto", "dra_v1beta1.proto", "pluginregistration.proto",
    "dra_health_v1.proto", "dra_health_v1alpha1.proto", "deviceplugin_v1beta1.proto",
)  # fmt: skip


def main() -> int:
    try:
        import grpc_tools  # type: ignore[import-untyped]
        from grpc_tools import protoc
    except ImportError:
        print("grpcio-tools is not installed: pip install grpcio-tools", file=sys.stderr)
        return 2
    here = Path(__file__).resolve().parent
    root = here.parent.parent
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    for name in PROTOS:
        args = [
            "grpc_tools.protoc",
            f"-I{root}",
            f"-I{well_known}",
            f"--python_out={root}",
            f"--pyi_out={root}",
            f"--grpc_python_out={root}",
            str((here / name).relative_to(root)),
        ]
        if protoc.main(args) != 0:
            print(f"protoc failed for {name}", file=sys.stderr)
            return 1
        # protoc writes bare `_Mapping` in the .pyi files; tell mypy --strict that this is expected.
        pyi = here / name.replace(".proto", "_pb2.pyi")
        text = pyi.read_text()
        if not text.startswith(PYI_HEADER):
            pyi.write_text(PYI_HEADER + text)
        # The gRPC module imports its messages as `driver.proto.<name>_pb2`; relative, so it also works
        # where the package is installed as `draguard.driver`.
        stub = here / name.replace(".proto", "_pb2_grpc.py")
        stub.write_text(stub.read_text().replace("from driver.proto import ", "from . import "))
        print(f"generated stubs for driver/proto/{name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
