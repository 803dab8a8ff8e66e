"""How every peer is timed: the method of the project's first peer runs, kept so that rows of old
and new runs compare.

Each repetition: read a 1 GiB buffer (flushes the L2, whose lines it leaves clean), spin the GPU
for about half a millisecond (torch.cuda._sleep, so the host's Python time to launch the call is
hidden behind it), then CUDA events around the call alone. The repetition count follows a quick
estimate: 60 for calls under 1 ms, 40 up to 5 ms, 30 above; the median is the time, p10 and p90
its spread.
"""

FLUSH_BYTES = 1 << 30
SPIN_CYCLES = 1_000_000  # >= ~0.5 ms at <= 2 GHz: longer than the host takes to launch a call


def reps_for(estimate_us: float) -> int:
    """Timed repetitions for a call of about estimate_us (at least 30)."""
    if estimate_us > 5000:
        return 30
    return 40 if estimate_us > 1000 else 60


def median(sorted_us):
    n = len(sorted_us)
    return sorted_us[n // 2] if n % 2 else 0.5 * (sorted_us[n // 2 - 1] + sorted_us[n // 2])


def quantile(sorted_us, p):
    """The nearest-rank quantile p in [0, 1] of sorted samples."""
    return sorted_us[min(len(sorted_us) - 1, int(round(p * (len(sorted_us) - 1))))]


class Timer:
    """CUDA-event timing of peer calls on the current device."""

    def __init__(self, torch):
        self.torch = torch
        # int32 ones: a read-only buffer far larger than the L2 (50-60 MB on Hopper).
        self.flush_buffer = torch.ones(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")

    def samples_us(self, fn, reps, warmup=5, flush=True):
        """reps timings of fn() in microseconds, after `warmup` untimed calls."""
        torch = self.torch
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for start, end in zip(starts, ends):
            if flush:
                self.flush_buffer.sum()
            torch.cuda._sleep(SPIN_CYCLES)
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]

    def measure(self, fn):
        """dict(time_us (median), p10_us, p90_us, reps) of fn, the count chosen by reps_for."""
        estimate = sorted(self.samples_us(fn, 3, warmup=2))[1]
        us = sorted(self.samples_us(fn, reps_for(estimate)))
        return dict(time_us=median(us), p10_us=quantile(us, 0.1), p90_us=quantile(us, 0.9),
                    reps=len(us))
