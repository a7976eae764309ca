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


def test_a_yaml_error_names_the_file_line_and_column(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\nquestions:\n  - {id: A, options: [1, 2]\n")
    with pytest.raises(InputError, match=r"mine\.yaml, line 4, column 1: not valid YAML: expected ',' or '}'"):
        Rubric.load(path)


def test_an_unknown_key_is_an_error_naming_the_key_meant():
    with pytest.raises(InputError, match=r"question 1 \(A\): unknown key 'mian'; did you mean 'main'\?"):
        Rubric.from_dict({"questions": [{"id": "A", "mian": True, "options": [1, 2]}]}, "r.yaml")
    with pytest.raises(InputError, match=r"unknown key 'lable'; did you mean 'label'\?"):
        Rubric.from_dict({"questions": [{"id": "A", "options": [{"value": 1, "lable": "x"}]}]}, "r.yaml")
    with pytest.raises(InputError, match=r"r\.yaml: unknown key 'question'; did you mean 'questions'\?"):
        Rubric.from_dict({"questions": [{"id": "A", "options": [1]}], "question": []}, "r.yaml")


def test_without_a_main_question_the_first_is_taken_and_said_once(caplog):
    data = {"questions": [{"id": "A", "options": [1, 2]}, {"id": "B", "options": [1, 2]}]}
    with caplog.at_level("WARNING"):
        assert Rubric.from_dict(data, "no-main.yaml").main.id == "A"
        Rubric.from_dict(data, "no-main.yaml")
        Rubric.from_dict(data, "told.yaml", warn_main=False)
    said = [r.getMessage() for r in caplog.records if "main: true" in r.getMessage()]
    assert said == [
        "no-main.yaml: no question has main: true, so the first, A, is the main question (mark the one meant)"
    ]


def test_rubric_takes_a_path_to_any_yaml_file(tmp_path):
    from llmrubric.config import compose
    from llmrubric.experiments.experiment import load_rubric

    path = tmp_path / "elsewhere.yaml"
    path.write_text("questions:\n  - id: X\n    main: true\n    options: [1, 2, 3]\n")
    rubric = load_rubric(compose("config", [f"rubric={path}"]))
    assert rubric.ids == ["X"] and rubric.name == "elsewhere" and rubric.main.id == "X"
    with pytest.raises(InputError, match="nope.yaml: rubric file not found"):
        compose("config", [f"rubric={tmp_path / 'nope.yaml'}"])
