"""Checks of a scenario's settings against its span (`duration_s`), each giving the message of a
problem or None; `scenario._Builder` attaches the field path and line.

A run steps through every instant of its clocks, even those at which nothing happens: the cycle
every `cycle_s`, the fair-share recompute every `recompute_s` (or each pool's
`policy.recompute_interval_s`) and the timeline sample every `timeline_s`. An idle step costs
about 20 µs, a cycle that decides something milliseconds, and each sample adds a timeline row per
queue, so a step too small for the span would leave the run going for days. A run takes at most
`MAX_STEPS` cycles and as many recomputes (a year at 60 s is 525,600), and `MAX_SAMPLES`
timeline samples (a year at the default 600 s is 52,560).

A generator must make jobs (`generator_idle`), and every job it can draw must be one the service
accepts (`generator_problems`): its pod counts and GPUs per pod are numbers or choices, so the
jobs it can make are known before it runs.
"""

from __future__ import annotations

from gpufair.sim.admission import Admission, field_problems
from gpufair.sim.generators import GeneratorSpec

MAX_STEPS = 1_000_000  # cycles, and recomputes, of one run
MAX_SAMPLES = 100_000  # timeline samples of one run


def too_many_steps(
    field: str, step_s: float, duration_s: float, what: str, bound: int
) -> str | None:
    """Why stepping `duration_s` by `step_s` (the value of `field`) is too much, or None."""
    least_s = duration_s / bound
    if step_s >= least_s:
        return None
    return (
        f"{field} {step_s:g} s over duration_s {duration_s:g} s makes {duration_s / step_s:.3g} "
        f"{what}; a run takes at most {bound:,}: make {field} at least {least_s:g} s or "
        "duration_s shorter"
    )


def generator_idle(start_s: float, stop_s: float | None, duration_s: float) -> str | None:
    """Why a generator starting at `start_s` would make no job, or None: it stops at or before
    its start (no arrival at or after `stop_s`), or the run ends first (`duration_s`, inf when
    unknown)."""
    if stop_s is not None and start_s >= stop_s:
        return f"{start_s:g} s is not before stop_s ({stop_s:g} s): the generator makes no jobs"
    if start_s >= duration_s:
        return (
            f"{start_s:g} s is not before the end of the run (duration_s {duration_s:g} s): "
            "the generator makes no jobs"
        )
    return None


def generator_problems(
    path: str, spec: GeneratorSpec, admission: Admission, *, fit: bool
) -> list[tuple[str, str]]:
    """(field path, message) of what the service would refuse among the jobs `spec` can draw:
    each of its pod counts with each of its GPUs per pod (both a number or a choice), the other
    fields as given. With `fit` (its queue and pool are known), also a job the cluster could
    never take (`Admission.cluster_refusal`), once per reason."""
    fields: dict[str, str] = {}
    reasons: dict[str, str] = {}
    for pods in spec.pods.values:
        for gpus in spec.gpus_per_pod.values:
            workload = spec.workload(1, int(pods), gpus, 0.0)
            found = field_problems(workload)
            for field, message in found:
                if field == "uid":
                    uids = f"makes job uids such as {workload.uid!r}: {message}"
                    fields.setdefault("name", uids)
                else:
                    fields.setdefault(_FIELDS.get(field, field), message)
            reason = admission.cluster_refusal(workload) if fit and not found else None
            if reason is not None and reason not in reasons:
                reasons[reason] = f"a job of {_many(pods, 'pod')} of {_many(gpus, 'GPU')}: {reason}"
    return [(f"{path}.{f}", m) for f, m in fields.items()] + [(path, m) for m in reasons.values()]


_FIELDS = {"allowed_gpu_types": "gpu_types"}  # the service's field name -> the scenario's


def _many(count: float, noun: str) -> str:
    return f"{count:g} {noun}" + ("" if count == 1 else "s")
