"""Accuracy beside energy: a scored trial's replies judged against their answers, and what each
correct answer cost (``sweeper.core.scoring``; the actor's ``actors.quality.accuracy``)."""

from __future__ import annotations

from dataclasses import dataclass

from sweeper.core.results.part import Part, column


@dataclass(frozen=True)
class Accuracy(Part):
    """The measured replies scored (null throughout for a trial without ``scoring``)."""

    n_scored: int | None = column(
        "replies judged: every completed request of the measured window (serving: of the measured run) whose "
        "prompt has a reference answer")
    n_correct: int | None = column("of them, those judged right")
    n_questions: int | None = column(
        "distinct prompts (conversations: turns) among the scored replies; below n_scored where the window sent "
        "prompts again")
    accuracy: float | None = column(
        "the mean over the n_questions of the share of each one's replies judged right: n_correct / n_scored "
        "where each was sent once (replies cut by the output length count as wrong)")
    accuracy_ci95_low: float | None = column(
        "the Wilson 95 % score interval's lower end for accuracy, over the n_questions distinct prompts (a prompt "
        "sent again is not a new draw; docs/METHOD.md)")
    accuracy_ci95_high: float | None = column("the Wilson 95 % score interval's upper end for accuracy")
    n_truncated: int | None = column(
        "scored replies cut by the output length (max_output_len) before the model ended them: counted wrong")
    energy_per_correct_j: float | None = column(
        "the GPU energy of the scored requests (their energy_j summed) / n_correct; null with no correct "
        "answer or where requests' energies are not attributed (no GPU)")
    correct_per_kj: float | None = column("n_correct per kJ of the scored requests' GPU energy (1000 / energy_per_correct_j)")


@dataclass(frozen=True)
class ChoiceLikelihood(Part):
    """Multiple choice scored by likelihood (``scoring: {method: choice, likelihood: true}``): the
    choice the model finds likeliest after each question's prompt, in a pass after the measured
    window (no energy is measured for it; null throughout where not asked for)."""

    likelihood_n_scored: int | None = column("questions scored by likelihood: the trial's distinct dataset prompts")
    likelihood_accuracy: float | None = column(
        "share of those whose likeliest choice (the sum of its tokens' log-probabilities after the prompt) is the "
        "answer: lm-evaluation-harness's acc")
    likelihood_accuracy_ci95_low: float | None = column("the Wilson 95 % score interval's lower end for likelihood_accuracy")
    likelihood_accuracy_ci95_high: float | None = column("the Wilson 95 % score interval's upper end for likelihood_accuracy")
    likelihood_accuracy_norm: float | None = column(
        "the same with each choice's log-likelihood divided by its text's length in characters: lm-evaluation-"
        "harness's acc_norm (long choices are not penalised for their length)")
    likelihood_status: str | None = column(
        "ok | not applicable: ... (the engine gives no prompt log-probabilities, or the model no tokenizer) | "
        "failed: ... (the trial's status stays ok); null: not asked for")
