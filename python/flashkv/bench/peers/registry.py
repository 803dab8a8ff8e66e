"""The peers by name, and the selection `--peers torch,flashinfer` makes of them.

A peer has a name (what --peers takes), the system name its rows carry (the result schema's
`system`, unchanged from the project's earlier peer runs so old and new rows compare), the group
it belongs to, and which workloads it runs: `decode`, `prefill` (square, qo_len == kv_len: P1-P5)
and `append` (prefill with qo_len < kv_len: A1, S1).
"""

from dataclasses import dataclass

GROUPS = ("torch", "flashinfer")


@dataclass(frozen=True)
class Peer:
    name: str
    group: str
    runs: tuple  # of "decode", "prefill", "append"
    systems: dict  # run -> the rows' system name
    how: str  # which module runs it: "sdpa", "sdpa-lower-right", "varlen", "flex", "flashinfer"
    variant: str = ""  # the SDPA backend or the FlashInfer system

    def runs_on(self, workload) -> bool:
        return self.run_of(workload) in self.runs

    @staticmethod
    def run_of(workload) -> str:
        if workload.kind == "decode":
            return "decode"
        return "prefill" if workload.qo() == list(workload.kv_lens) else "append"

    def system(self, workload, kv_dtype=None) -> str:
        name = self.systems[self.run_of(workload)]
        if kv_dtype and self.group == "flashinfer":
            return name.replace("flashinfer-0.7", f"flashinfer-0.7-{kv_dtype}")
        return name


def _sdpa(backend):
    padded = f"torch-sdpa-{backend}-padded"
    return Peer(f"sdpa-{backend}", "torch", ("decode", "prefill", "append"),
                {"decode": padded, "prefill": padded, "append": f"torch-sdpa-{backend}-boolmask"},
                "sdpa", backend)


def _flashinfer(system, runs):
    return Peer(f"flashinfer-{system}", "flashinfer", runs,
                {r: f"flashinfer-0.7 {system}" for r in runs}, "flashinfer", system)


PEERS = [
    _sdpa("flash"), _sdpa("cudnn"), _sdpa("efficient"),
    Peer("sdpa-lower-right", "torch", ("append",), {"append": "torch-sdpa-lower-right"},
         "sdpa-lower-right"),
    Peer("fa2-varlen", "torch", ("decode", "prefill", "append"),
         {r: "torch-fa2-varlen" for r in ("decode", "prefill", "append")}, "varlen"),
    Peer("flex", "torch", ("prefill",), {"prefill": "torch-flex-attention"}, "flex"),
    _flashinfer("decode", ("decode",)),
    _flashinfer("decode-tc", ("decode",)),
    _flashinfer("prefill-fa2", ("prefill", "append")),
    _flashinfer("prefill-fa3", ("prefill", "append")),
]
BY_NAME = {p.name: p for p in PEERS}


def names():
    """Everything --peers accepts: the groups, "all", then each peer."""
    return list(GROUPS) + ["all"] + [p.name for p in PEERS]


def select(spec):
    """The peers a comma-separated list of groups and names picks, in registry order, each once.
    Raises ValueError naming the bad entry and what is accepted."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"--peers: expected a comma-separated list of {', '.join(names())}; "
                         f"got {spec!r}")
    chosen = set()
    for item in (x.strip() for x in spec.split(",")):
        if not item:
            raise ValueError(f"--peers: empty entry in {spec!r}")
        if item == "all":
            chosen.update(p.name for p in PEERS)
        elif item in GROUPS:
            chosen.update(p.name for p in PEERS if p.group == item)
        elif item in BY_NAME:
            chosen.add(item)
        elif item.endswith(".py") or "/" in item:
            raise ValueError(f"--peers: {item!r} looks like a script path; --peers now takes peer "
                             f"names ({', '.join(names())}): the peers are flashkv's own code")
        else:
            raise ValueError(f"--peers: unknown peer {item!r}; expected some of "
                             f"{', '.join(names())}")
    return [p for p in PEERS if p.name in chosen]
