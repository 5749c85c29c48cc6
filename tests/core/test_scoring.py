"""The scorers on hand-written replies: every normalisation and extraction rule, GSM8K's
``####``, choices by letter and by text, cut replies, and the Wilson interval."""

from __future__ import annotations

import math

import pytest

from actors.quality.accuracy import Reply, accuracy_of, score
from sweeper.core.results import RequestRecord
from sweeper.core.scoring import Reference, ScoringSettings, judge, normalise, wilson_interval

EXACT = ScoringSettings(method="exact")
NUMERIC = ScoringSettings.model_validate("numeric")
CHOICE = ScoringSettings(method="choice")
ABCD = ("Paris", "London", "Berlin", "New Paris")


def right(reply: str, answer: str, settings: ScoringSettings, choices: tuple[str, ...] | None = None) -> bool:
    return judge(reply, Reference(answer, choices), settings, cut=False).correct


@pytest.mark.parametrize(("text", "normal"), [
    ("  Paris  ", "paris"),  # whitespace trimmed
    ("PARIS", "paris"),  # case folded
    ("Straße", "strasse"),  # case folded, not merely lowered
    ("Paris.", "paris"),  # punctuation dropped
    ("«Paris»!", "paris"),  # Unicode punctuation too
    ("New\n  York\tCity", "new york city"),  # whitespace collapsed
    ("don't", "dont"),
])
def test_normalisation_folds_case_drops_punctuation_and_collapses_whitespace(text, normal):
    assert normalise(text) == normal


@pytest.mark.parametrize(("reply", "answer", "ok"), [
    ("Paris", "paris", True),
    (" PARIS. ", "Paris", True),
    ("The capital is Paris.", "Paris", False),  # exact is the whole reply, not a word of it
    ("", "Paris", False),
])
def test_exact_compares_whole_normalised_replies(reply, answer, ok):
    assert right(reply, answer, EXACT) is ok


@pytest.mark.parametrize(("reply", "answer", "extracted", "ok"), [
    ("The answer is 42.", "42", "42", True),
    ("First 3 + 4 = 7, then 7 * 6 = 42", "42", "42", True),  # the last number
    ("42, not 41", "42", "41", False),
    ("It costs $1,234.50 in all.", "1234.5", "1,234.50", True),  # separators, currency, decimals
    ("-7", "-7", "-7", True),
    ("−7 degrees", "-7", "−7", True),  # a Unicode minus
    ("2.5e3", "2500", "2.5e3", True),
    ("Natalia sold 48 + 24 = 72 clips. #### 72 and that's 3 days", "72", "72", True),  # GSM8K's marker first
    ("#### 18", "18", "18", True),
    ("no number here", "5", None, False),
    ("w3 x2y", "3", None, False),  # digits inside words are no numbers
    ("0.1 + 0.2 = 0.30000000000000004", "0.3", "0.30000000000000004", True),  # within the tolerance
    ("The answer is 42.1", "42", "42.1", False),
])
def test_numeric_reads_the_last_number_or_the_one_after_the_gsm8k_marker(reply, answer, extracted, ok):
    j = judge(reply, Reference(answer), NUMERIC, cut=False)
    assert (j.extracted, j.correct, j.truncated) == (extracted, ok, False)


def test_numeric_tolerance_scales_with_the_answer_and_is_absolute_below_one():
    loose = ScoringSettings(method="numeric", tolerance=0.01)
    assert right("100.9", "100", loose) and not right("101.1", "100", loose)
    assert right("0.009", "0", loose) and not right("0.02", "0", loose)


def test_a_gsm8k_answer_in_the_file_is_the_part_after_its_marker(tmp_path):
    from sweeper.core.datasets import read_records

    path = tmp_path / "gsm8k.jsonl"
    path.write_text('{"question": "Natalia sold 48 clips... How many?", "answer": "48/2 = 24\\n48+24 = 72\\n#### 72"}\n'
                    '{"prompt": "2 + 2?", "answer": 4}\n')
    first, second = read_records(path)
    assert (first.prompt, first.answer) == ("Natalia sold 48 clips... How many?", "72")
    assert second.answer == "4"
    assert right("so 72 in all", first.answer, NUMERIC)


def test_regex_takes_the_first_match_s_first_group_normalised():
    settings = ScoringSettings(method="regex", pattern=r"[Aa]nswer:\s*(\w+)")
    j = judge("Thinking... Answer: PARIS. Answer: London", Reference("paris"), settings, cut=False)
    assert (j.extracted, j.correct) == ("PARIS", True)
    assert not right("I do not know", "paris", settings)
    whole = ScoringSettings(method="regex", pattern=r"\d+ apples")
    assert right("I have 3 apples now", "3 Apples", whole)


@pytest.mark.parametrize(("reply", "letter"), [
    ("B", "B"), ("b", "B"), ("(B)", "B"), ("B.", "B"), ("B) London", "B"), ("  c: Berlin", "C"),
    ("The answer is B.", "B"), ("Answer: (c)", "C"),
    ("It is London, of course.", "B"),  # by the choice's text
    ("new paris", "D"),  # a choice's text holding another's: the longer one
    ("Either Paris or London.", None),  # two choices named: none
    ("I cannot say.", None),
    ("E", None),  # no such choice
])
def test_choice_reads_a_letter_or_a_choice_s_text(reply, letter):
    j = judge(reply, Reference("B", ABCD), CHOICE, cut=False)
    assert j.extracted == letter and j.correct is (letter == "B")


def test_multiple_choice_records_letter_their_choices_and_take_a_letter_an_index_or_a_text(tmp_path):
    from sweeper.core.datasets import read_records

    path = tmp_path / "mc.jsonl"
    lines = ['{"question": "Capital of France?", "choices": ["London", "Paris"], "answer": "B"}',
             '{"question": "Capital of France?", "choices": ["London", "Paris"], "answer": 1}',
             '{"question": "Capital of France?", "choices": ["London", "Paris"], "answer": "Paris"}']
    path.write_text("\n".join(lines) + "\n")
    records = read_records(path)
    assert {r.answer for r in records} == {"B"} and records[0].choices == ("London", "Paris")
    assert records[0].prompt == "Capital of France?\nA. London\nB. Paris\nAnswer:"


@pytest.mark.parametrize(("line", "problem"), [
    ('{"question": "q", "choices": ["a", "b"], "answer": 2}', "field 'answer': 2 names none of the 2 choices"),
    ('{"question": "q", "choices": ["a", "b"]}', "field 'answer': missing"),
    ('{"question": "q", "choices": ["a"], "answer": 0}', "field 'choices': must be a list of 2 to 26"),
    ('{"prompt": "q", "answer": "#### "}', "field 'answer': must not be empty after ####"),
    ('{"prompt": "q", "answer": [1]}', "field 'answer': must be text or a number"),
    ('{"question": ""}', "field 'question': must be non-empty text"),
])
def test_bad_answers_name_the_record_and_field(tmp_path, line, problem):
    from sweeper.core.datasets import DatasetError, read_records

    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(DatasetError) as err:
        read_records(path)
    assert f"record 1 {problem}" in str(err.value)


def test_a_reply_cut_by_the_output_length_counts_only_an_answer_it_stated_before_the_cut():
    cut = judge("Step one: 40 + 2 = 42, so", Reference("42"), NUMERIC, cut=True)
    assert (cut.correct, cut.truncated, cut.extracted) == (False, True, "42")  # a step of its working
    nothing = judge("Let me think step by step about", Reference("42"), NUMERIC, cut=True)
    assert (nothing.correct, nothing.truncated, nothing.extracted) == (False, True, None)
    # Replies read on the GPU (bench step accuracy_transformers): the answer stated, then a loop.
    looped = judge("So 8 + 3 = 11. #### 11 Liam has 11 stickers. #### 11 Liam has 11 st", Reference("11"), NUMERIC,
                   cut=True)
    assert (looped.correct, looped.truncated, looped.extracted) == (True, True, "11")
    revised = judge("#### 420 Jonas has 13 + 20 = 33 books. The answer is 33. Jonas", Reference("33"), NUMERIC, cut=True)
    assert revised.correct and revised.extracted == "33"  # the last answer stated
    stated_wrong = judge("The answer is 6. Ben buys 1 more, so 6 + 1 = 7", Reference("7"), NUMERIC, cut=True)
    assert not stated_wrong.correct and stated_wrong.extracted == "6"  # its answer, not a later step
    # A number at the very end may be cut short ("36" of "360"): not an answer stated.
    assert not judge("The answer is 36", Reference("36"), NUMERIC, cut=True).correct
    assert judge("The answer is 36", Reference("36"), NUMERIC, cut=False).correct
    # Multiple choice: a letter named as the answer; a regex's match the reply goes on after.
    assert judge("The answer is (C). Because the", Reference("C", ABCD), CHOICE, cut=True).correct
    assert not judge("A, B or C? Let me weigh", Reference("C", ABCD), CHOICE, cut=True).correct
    regex = ScoringSettings(method="regex", pattern=r"ANSWER: (\w+)")
    assert judge("ANSWER: paris and then", Reference("Paris"), regex, cut=True).correct
    assert not judge("ANSWER: par", Reference("Paris"), regex, cut=True).correct
    # exact judges the whole reply: a cut one is never it.
    assert not judge("paris", Reference("paris"), ScoringSettings(method="exact"), cut=True).correct


@pytest.mark.parametrize(("k", "n"), [(0, 10), (10, 10), (5, 10), (81, 100), (1, 3), (999, 1000)])
def test_the_wilson_interval_holds_the_proportions_the_score_test_does_not_reject(k, n):
    """Wilson's interval is every p with (k/n - p)^2 = z^2 p (1 - p) / n at its ends: checked on
    that defining equation, not on the closed form the code uses."""
    from sweeper.core.scoring import Z95

    lo, hi = wilson_interval(k, n)
    p = k / n
    assert 0.0 <= lo <= p <= hi <= 1.0
    for end in (lo, hi):
        if end not in (p,):  # an end at 0 or 1 successes is p itself
            assert (p - end) ** 2 == pytest.approx(Z95 ** 2 * end * (1 - end) / n, rel=1e-9, abs=1e-15)
    if k == 0:
        assert lo == 0.0 and hi == pytest.approx(Z95 ** 2 / (n + Z95 ** 2))
    if 2 * k == n:
        assert lo + hi == pytest.approx(1.0)
    assert wilson_interval(0, 0) is None


def records(*energies: float | None) -> list[RequestRecord]:
    return [RequestRecord(trial_id="t", request_index=i, output_tokens=4, energy_j=e) for i, e in enumerate(energies)]


def test_a_trials_accuracy_counts_its_judged_requests_and_divides_their_energy_by_the_correct_ones():
    replies = [Reply("42", Reference("42"), cut=False), Reply("41", Reference("42"), cut=False),
               Reply("40 and", Reference("42"), cut=True), None]  # the last: no answer, unscored
    judged, acc = score(records(10.0, 20.0, 30.0, 40.0), replies, NUMERIC)
    assert [r.correct for r in judged] == [True, False, False, None]
    assert [r.truncated for r in judged] == [False, False, True, None]
    assert [r.extracted_answer for r in judged] == ["42", "41", "40", None]
    assert [r.reply for r in judged] == ["42", "41", "40 and", None]  # what the reader checks
    assert (acc.n_scored, acc.n_correct, acc.n_truncated, acc.n_questions) == (3, 1, 1, 3)
    assert acc.accuracy == pytest.approx(1 / 3)
    assert acc.energy_per_correct_j == pytest.approx(60.0) and acc.correct_per_kj == pytest.approx(1000 / 60)
    assert (acc.accuracy_ci95_low, acc.accuracy_ci95_high) == pytest.approx(wilson_interval(1, 3))


def test_a_prompt_sent_again_is_one_question_in_the_accuracy_and_its_interval():
    """Four replies to question a (all right) and one to b (wrong): by reply 4/5, by question 1/2,
    and the interval is over the 2 questions, not the 5 replies; the energy per correct answer
    still pays for every reply."""
    a, b = Reply("42", Reference("42"), False, question="a"), Reply("41", Reference("42"), False, question="b")
    _, acc = score(records(1.0, 1.0, 1.0, 1.0, 1.0), [a, a, b, a, a], NUMERIC)
    assert (acc.n_scored, acc.n_correct, acc.n_questions) == (5, 4, 2)
    assert acc.accuracy == pytest.approx(0.5)
    assert (acc.accuracy_ci95_low, acc.accuracy_ci95_high) == pytest.approx(wilson_interval(1, 2))
    assert acc.energy_per_correct_j == pytest.approx(5.0 / 4)
    split = score(records(1.0, 1.0, 1.0), [a, Reply("7", Reference("42"), False, question="a"), b], NUMERIC)[1]
    assert split.accuracy == pytest.approx((0.5 + 0.0) / 2) and split.n_questions == 2


def test_no_correct_answer_costs_null_not_infinity_and_no_energy_leaves_both_null():
    none_right = accuracy_of(score(records(5.0, 5.0), [Reply("1", Reference("2"), False)] * 2, NUMERIC)[0])
    assert none_right.accuracy == 0.0 and none_right.energy_per_correct_j is None
    assert none_right.correct_per_kj == 0.0 and not math.isinf(none_right.accuracy_ci95_high or 0)
    no_energy = score(records(None, None), [Reply("2", Reference("2"), False)] * 2, NUMERIC)[1]
    assert no_energy.accuracy == 1.0 and no_energy.energy_per_correct_j is None and no_energy.correct_per_kj is None


@pytest.mark.parametrize(("given", "problem"), [
    ("levenshtein", "unknown scoring method 'levenshtein'"),
    ({"method": "regex"}, "pattern: required by method regex"),
    ({"method": "regex", "pattern": "(unclosed"}, "not a regular expression"),
    ({"method": "exact", "tolerance": 0.1}, "tolerance: not used by method exact"),
    ({"method": "numeric", "tolerance": -1}, "greater than or equal to 0"),
    ({"method": "numeric", "likelihood": True}, "likelihood: scores a question's choices, and method numeric has none"),
])
def test_bad_scoring_settings_say_what_is_wrong(given, problem):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as err:
        ScoringSettings.model_validate(given)
    assert problem in str(err.value)


def test_likelihood_joins_a_choice_scoring_s_trial_ids_only_when_asked_for():
    plain = ScoringSettings.model_validate("choice")
    assert plain.canonical_json() == '{"method":"choice"}'  # trials scored before it keep their ids
    assert '"likelihood":true' in ScoringSettings.model_validate({"method": "choice", "likelihood": True}).canonical_json()


def test_the_likeliest_choice_by_its_sum_and_by_its_sum_per_character():
    from actors.quality.likelihood import chosen

    # A long right answer loses on its summed log-probability and wins per character.
    assert chosen([-4.0, -9.0, -6.0], ["Paris", "the capital city of France", "Rome"]) == (0, 1)
    assert chosen([-2.0, -2.0], ["a", "b"]) == (0, 0)  # the first of equals, as numpy's argmax
