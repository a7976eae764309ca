import pytest

from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric, option_key


def test_option_key_canonicalises_numbers():
    assert option_key(4) == option_key(4.0) == option_key("4.0") == option_key(" 4 ") == "4"
    assert option_key("support") == "support"
    assert option_key(2.5) == "2.5"


def test_paper_rubric(rubric):
    assert rubric.ids == [f"Q{i}" for i in range(9)]
    assert rubric.main.id == "Q0"
    assert rubric["Q8"].keys == ("1", "2", "3")
    assert rubric["Q8"].llm_options == ("1", "2", "3", "4")
    assert rubric["Q1"].index_of(4.0) == 3
    assert rubric["Q1"].index_of("Likely.") == 3
    assert rubric["Q1"].index_of(5) is None


def test_with_main_and_round_trip(rubric):
    other = rubric.with_main("Q3")
    assert other.main.id == "Q3" and rubric.main.id == "Q0"
    assert Rubric.from_dict(rubric.to_dict()) == rubric
    with pytest.raises(InputError, match="Q9"):
        rubric.with_main("Q9")


def test_question_without_options_is_an_error():
    with pytest.raises(InputError, match="no options"):
        Rubric.from_dict({"questions": [{"id": "Q0", "options": []}]}, "bad.yaml")


def test_unquoted_label_with_a_comma_is_an_error(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(
        "questions:\n  - id: Q0\n    options:\n      - {value: 1, label: No, never}\n      - {value: 2, label: Yes}\n"
    )
    with pytest.raises(InputError, match="quote labels"):
        Rubric.load(path)
