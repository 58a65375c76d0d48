"""CPU time of a process that builds the fast engine's optimiser: torch's constructor against
``hlbl.eager.build_optimizer`` (the same SGD with momentum, without importing ``torch._dynamo``).

    python bench/optimizer_import.py --out results/optimizer_import.json   # 5 rounds
    python bench/optimizer_import.py --quick                               # one round

Each round starts one fresh interpreter per way, alternately (side by side: a loaded machine
slows both alike); each child imports torch, builds the optimiser over one parameter and reports
its own user + system CPU seconds and whether ``torch._dynamo`` was loaded. The result is the
median of the rounds per way and the difference of the medians (what every training process
saves). ``python -X importtime -c "import torch; import torch._dynamo"`` shows where it goes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from _common import ROOT, add_common, finish_args, machine, spread, write_json

BUILD = "import torch\np = torch.nn.Parameter(torch.zeros(3))\n"
WAYS = {
    "torch.optim.SGD": BUILD + "torch.optim.SGD([p], lr=0.1, momentum=0.9)\n",
    "hlbl.eager.build_optimizer": BUILD
    + "from hlbl.eager import build_optimizer\nbuild_optimizer(torch.optim.SGD, [p], lr=0.1, momentum=0.9)\n",
}
REPORT = "import resource, sys\nu = resource.getrusage(resource.RUSAGE_SELF)\nprint(u.ru_utime + u.ru_stime, 'torch._dynamo' in sys.modules)\n"


def one(code: str) -> tuple[float, bool]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code + REPORT], capture_output=True, text=True, check=True, env=env)
    cpu, dynamo = out.stdout.split()
    return float(cpu), dynamo == "True"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    add_common(ap, out="results/optimizer_import.json", optional_out=True)
    args = finish_args(ap.parse_args(), rounds=1)
    cpu: dict[str, list[float]] = {k: [] for k in WAYS}
    dynamo: dict[str, bool] = {}
    for _ in range(args.rounds):
        for name, code in WAYS.items():
            seconds, dynamo[name] = one(code)
            cpu[name].append(seconds)
    result = {
        "cpu_s": {k: spread(v) for k, v in cpu.items()},
        "imports_torch_dynamo": dynamo,
        "saved_cpu_s": spread(cpu["torch.optim.SGD"])["median"] - spread(cpu["hlbl.eager.build_optimizer"])["median"],
        "rounds": args.rounds,
        "machine": machine(),
    }
    for k, v in result["cpu_s"].items():
        print(f"{k}: median {v['median']:.2f} CPU-s ({v['min']:.2f}-{v['max']:.2f}), torch._dynamo loaded: {dynamo[k]}")
    print(f"saved per process: {result['saved_cpu_s']:.2f} CPU-s")
    if dynamo["hlbl.eager.build_optimizer"]:
        raise SystemExit("hlbl.eager.build_optimizer loaded torch._dynamo")
    if args.out:
        write_json(args.out, result)


if __name__ == "__main__":
    main()
