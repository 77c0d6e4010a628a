"""``tandem advise`` and the length predictor: a candidate whose dispatch and scheduling
read no predicted lengths runs with predictor ``none`` (the same run as with any other),
so it is evaluated once and the advice never names a predictor that has no effect.

Seen before: ``tandem advise streamrl-7b --budget-s 40`` advised ``random/fcfs/oracle``
and warned that the oracle is simulator-only; its evaluations.csv held
``round-robin/fcfs/oracle`` and ``round-robin/fcfs/none``, both at 35.3787356078026."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import replace

from experiments.advise import AdviseOptions, advise
from experiments.advise_eval import Evaluation, PoolEvaluator
from experiments.advise_plan import SpaceOptions, plan_space
from experiments.advise_report import _unread_predictor_notes, write_advice
from experiments.advise_space import Candidate, PolicyChoice, canonical, predictor_read
from tests.test_advise_space import small_spec

NO_LENGTHS = ("mode=stream-async", "tp=1", "max_num_seqs=32", "split_parts=2",
              "dispatch=round-robin,random", "scheduling=fcfs", "predictor=oracle,none")  # fmt: skip


class _Recording:
    """The real simulator, every call recorded."""

    def __init__(self, evaluator: PoolEvaluator) -> None:
        self.workers = 1
        self._evaluator = evaluator
        self.calls: list[tuple[Candidate, int]] = []

    def submit(self, c: Candidate, iterations: int) -> Future[Evaluation]:
        self.calls.append((c, iterations))
        return self._evaluator.submit(c, iterations)


def test_a_candidate_reading_no_lengths_has_predictor_none_once():
    axes = ("dispatch=random,round-robin,least-loaded", "scheduling=fcfs,lpt",
            "predictor=oracle,noisy-oracle,none", "max_num_seqs=32")  # fmt: skip
    space = plan_space(small_spec(), SpaceOptions(axes=axes))
    unread = [c for c in space.candidates if not predictor_read(c)]
    assert unread and {c.policies.predictor for c in unread} == {"none"}
    per_structure = [
        (c.structure, c.policies.dispatch) for c in unread if c.structure.num_instances > 1
    ]
    assert len(per_structure) == len(set(per_structure))  # one predictor, one scheduling each
    read = [c for c in space.candidates if predictor_read(c)]
    assert {c.policies.predictor for c in read} == {"oracle", "noisy-oracle", "none"}


def test_one_instance_makes_dispatch_moot_so_fcfs_reads_no_lengths():
    c = plan_space(small_spec(), SpaceOptions(axes=NO_LENGTHS)).candidates[0]
    structure = replace(c.structure, generation_gpus=(1,), tp=1)
    one = Candidate(structure, PolicyChoice("skewness-aware", "fcfs", "oracle"))
    assert one.structure.num_instances == 1
    prefer = PolicyChoice("skewness-aware", "lpt", "oracle")
    assert canonical(one, prefer).policies == PolicyChoice("least-loaded", "fcfs", "none")
    lpt = Candidate(one.structure, PolicyChoice("round-robin", "lpt", "oracle"))
    assert canonical(lpt, prefer).policies == PolicyChoice("skewness-aware", "lpt", "oracle")


def test_advice_reading_no_lengths_runs_once_says_none_and_warns_of_no_oracle(tmp_path):
    spec = small_spec().model_copy(deep=True)  # the input as the trial's advice
    spec.policies.dispatch, spec.policies.scheduling = "round-robin", "fcfs"
    recording = _Recording(PoolEvaluator(spec, 1))
    options = AdviseOptions(SpaceOptions(axes=NO_LENGTHS), budget_s=120.0, workers=1)
    advice = advise(spec, options, evaluator=recording)
    assert {c.policies.predictor for c, _ in recording.calls} == {"none"}
    assert all(not predictor_read(c) for c, _ in recording.calls)
    assert len(recording.calls) == len(set(recording.calls))  # nothing simulated twice
    assert advice.best.policies.predictor == "none"
    assert advice.best_spec.policies.length_predictor == "none"
    text = (write_advice(advice, tmp_path) / "advice.md").read_text()
    assert "`oracle` length predictor, which only" not in text
    assert (
        "The input's length predictor: its dispatch `round-robin` and scheduling `fcfs` read no "
        "predicted lengths, so it was run, and is shown, with `none` (the same run)."
    ) in text
    # an input that reads lengths: the advice's own note names the input's predictor
    reading = replace(advice.space.input, policies=PolicyChoice("skewness-aware", "lpt", "oracle"))
    notes = _unread_predictor_notes(replace(advice, space=replace(advice.space, input=reading)))
    p = advice.best.policies
    assert notes == [
        "",
        f"The advice's length predictor: its dispatch `{p.dispatch}` and scheduling `fcfs` read "
        "no predicted lengths, so it runs with `none`, the same run as with the input spec's "
        "`oracle`: deployable as it is.",
    ]
