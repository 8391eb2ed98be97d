"""``fedaug env`` (or ``fedaug doctor``): what this installation can do, for a bug report or a slow run.

Prints :func:`fedaug.engine.records.installation.installation` as text (default) or JSON; every run directory
keeps the same report in its ``environment.jsonl``. torch is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("env", aliases=["doctor"],
                       help="versions, CPU, devices and precision flags, compiled libraries, extras, data sources",
                       description="Print what this installation can do: fedaug's, Python's and torch's versions, "
                                   "the CPU and torch's capability on it, every device, what a run with the default "
                                   "settings does here (device, captured or eager steps, data on the device or the "
                                   "host), the precision flags "
                                   "(TF32), fedaug's compiled CPU libraries (built or not, why not, what that "
                                   "costs), Triton and Flower, the optional extras' packages and the offline data "
                                   "sources present. Paste it into a bug report; every run directory keeps it in "
                                   "environment.jsonl.")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=main)


def _yes(flag: object) -> str:
    return "on" if flag else "off"


def render(report: dict[str, Any]) -> str:
    """The report as text, one topic a line (sub-items indented)."""
    t, cpu, prec = report["torch"], report["cpu"], report["precision"]
    override = f" (ATEN_CPU_CAPABILITY={cpu['capability_override']})" if cpu["capability_override"] else ""
    lines = [f"fedaug {report['fedaug']}, Python {report['python']}, {report['platform']}",
             f"torch {t['version']}: CUDA {t['cuda'] or 'none'}, cuDNN {t['cudnn'] or 'none'}, "
             f"OpenMP {_yes(t['openmp'])}, oneDNN {_yes(t['mkldnn'])}",
             f"cpu: {cpu['model']}, torch capability {cpu['capability']}{override}, {cpu['cores']} cores, "
             f"{cpu['threads']} torch threads",
             "devices:"]
    for d in report["devices"]:
        extra = (f", sm {d['capability']}, {d['memory_gib']} GiB, bf16 {'yes' if d['bf16'] else 'no'}"
                 if "capability" in d else "")
        lines.append(f"  {d['device']}: {d['name']}{extra}")
    d = report["defaults"]
    budget = f" (data.on_device = auto: up to {d['data_budget_gib']} GiB now)" if d["data_budget_gib"] else ""
    lines.append(f"defaults here: device auto = {d['device']}; steps {d['steps']} (train.cuda_graph = auto); "
                 f"data on the {d['data']}{budget}")
    lines.append(f"precision: float32 matmul precision {prec['float32_matmul_precision']}; TF32 in cuBLAS matmuls "
                 f"{_yes(prec['cuda_matmul_allow_tf32'])}, in cuDNN convolutions {_yes(prec['cudnn_allow_tf32'])}; "
                 f"reduced-precision fp16/bf16 reductions {_yes(prec['cuda_matmul_fp16_reduced_reduction'])}/"
                 f"{_yes(prec['cuda_matmul_bf16_reduced_reduction'])}; cuDNN deterministic "
                 f"{_yes(prec['cudnn_deterministic'])}, benchmark {_yes(prec['cudnn_benchmark'])}")
    lines.append("compiled libraries (fedaug kernel):")
    for name, lib in report["compiled"].items():
        lines.append(f"  {name}: built, {lib['path']}" if lib["built"] else
                     f"  {name}: NOT built: {lib['why_not']}; without it {lib['costs']}")
    lines.append(f"triton {report['triton'] or 'not installed'}; flower (flwr) {report['flower'] or 'not installed'}")
    lines.append("extras:" if report["extras"] else "extras: unknown (fedaug is not installed as a package)")
    for extra, packages in report["extras"].items():
        lines.append(f"  {extra}: " + ", ".join(f"{p} {v or 'NOT installed'}" for p, v in packages.items()))
    lines.append("data sources:")
    for name, status in report["data"].items():
        lines.append(f"  {name}: present" if status["present"] else f"  {name}: missing {'; '.join(status['missing'])}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from fedaug.engine.records.installation import installation

    report = installation()
    print(json.dumps(report, indent=2) if args.format == "json" else render(report))
    return 0
