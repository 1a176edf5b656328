"""Parameter types, validation, constraints and the per-task assignment context."""

import asyncio
import random
import re
import threading

import pytest

from opto import Constraint, Parameter, ParameterError, assign
from opto.core.parameters import current_assignment

# --------------------------------------------------------------------------- types


@pytest.mark.parametrize(
    "value, kind",
    [("text", str), (3, int), (2.5, float), (True, bool), (False, bool), ([1, "a"], list), ({"k": 1}, dict)],
)
def test_parameter_type_is_taken_from_the_initial_value(value, kind):
    param = Parameter(value, name="p")
    assert param.type is kind
    assert param.value == value
    assert param.stored_value == value


def test_bool_is_not_an_int_parameter():
    flag = Parameter(True, name="flag")
    assert flag.type is bool
    with pytest.raises(ParameterError, match="flag"):
        flag.value = 1
    count = Parameter(1, name="count")
    with pytest.raises(ParameterError, match="count: expected a int, got bool"):
        count.value = True


def test_unsupported_initial_type_is_rejected():
    with pytest.raises(ParameterError, match="str, int, float, bool, list or dict"):
        Parameter(None)
    with pytest.raises(ParameterError, match="set"):
        Parameter({1, 2})
    with pytest.raises(ParameterError, match="tuple"):
        Parameter((1, 2))


def test_float_parameter_accepts_an_int_and_stores_a_float():
    temperature = Parameter(0.5, name="temperature")
    temperature.value = 1
    assert temperature.value == 1.0 and isinstance(temperature.value, float)


def test_float_parameter_rejects_non_finite_values():
    temperature = Parameter(0.5, name="temperature")
    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(ParameterError, match="temperature: .* not a finite number"):
            temperature.value = bad
    assert temperature.value == 0.5


def test_wrong_type_error_names_the_parameter_and_the_value():
    prompt = Parameter("Answer.", name="system_prompt")
    with pytest.raises(ParameterError) as info:
        prompt.value = 42
    message = str(info.value)
    assert "system_prompt" in message
    assert "expected a str" in message
    assert "int" in message and "42" in message
    assert prompt.value == "Answer."  # a failed write changes nothing


def test_parameter_error_is_a_value_error():
    assert issubclass(ParameterError, ValueError)


def test_an_invalid_initial_value_fails_at_construction():
    with pytest.raises(ParameterError, match="k: .*above the maximum 5"):
        Parameter(9, name="k", constraint=Constraint(max=5))


def test_describe_shows_what_the_optimizer_needs():
    param = Parameter(
        3, name="k", description="how many", trainable=False, constraint=Constraint("small", min=1, max=5)
    )
    assert param.describe() == {
        "name": "k",
        "type": "int",
        "trainable": False,
        "description": "how many",
        "constraint": "small; >= 1; <= 5",
        "value": 3,
    }


# --------------------------------------------------------------------- constraints


def test_constraint_choices():
    style = Parameter("short", name="style", constraint=Constraint(choices=["short", "long"]))
    style.value = "long"
    assert style.value == "long"
    with pytest.raises(ParameterError, match=r"style: 'medium' is not one of \['short', 'long'\]"):
        style.value = "medium"
    assert style.value == "long"
    assert style.describe_constraint() == 'one of ["short", "long"]'


def test_constraint_min_and_max():
    k = Parameter(3, name="k", constraint=Constraint(min=1, max=5))
    k.value = 1
    k.value = 5
    with pytest.raises(ParameterError, match="k: 0 is below the minimum 1"):
        k.value = 0
    with pytest.raises(ParameterError, match="k: 6 is above the maximum 5"):
        k.value = 6
    assert k.value == 5


def test_constraint_max_length_for_text_and_lists():
    prompt = Parameter("abc", name="prompt", constraint=Constraint(max_length=5))
    prompt.value = "abcde"
    with pytest.raises(ParameterError, match="prompt: length 6 is over the maximum 5"):
        prompt.value = "abcdef"
    shots = Parameter(["a"], name="shots", constraint=Constraint(max_length=2))
    shots.value = ["a", "b"]
    with pytest.raises(ParameterError, match="shots: length 3"):
        shots.value = ["a", "b", "c"]


def test_constraint_callable_check():
    even = Parameter(2, name="even", constraint=Constraint(check=lambda v: v % 2 == 0))
    even.value = 4
    with pytest.raises(ParameterError, match="even: 5 fails the parameter's check"):
        even.value = 5
    assert even.value == 4


def test_a_bare_callable_constraint_is_a_check():
    upper = Parameter("ABC", name="upper", constraint=str.isupper)
    assert isinstance(upper.constraint, Constraint)
    with pytest.raises(ParameterError, match="upper: 'abc' fails the parameter's check"):
        upper.value = "abc"


def test_a_check_that_raises_rejects_the_value_with_the_reason():
    def check(value):
        if "x" in value:
            raise RuntimeError("no x allowed")
        return True

    word = Parameter("abc", name="word", constraint=check)
    with pytest.raises(ParameterError, match="word: the check raised RuntimeError: no x allowed"):
        word.value = "xyz"
    assert word.value == "abc"


def test_a_text_constraint_is_shown_but_not_enforced():
    prompt = Parameter("hi", name="prompt", constraint="be polite")
    assert prompt.constraint == Constraint(text="be polite")
    prompt.value = "rude words"
    assert prompt.describe_constraint() == "be polite"


def test_constraint_describe_lists_every_check():
    text = Constraint("plain text", choices=["a", "b"], min=0, max=9, max_length=3).describe()
    assert text == 'plain text; one of ["a", "b"]; >= 0; <= 9; length at most 3'
    assert Constraint().describe() == ""


# -------------------------------------------------------------------------- assign


def test_assign_by_parameter_overrides_only_inside_the_block():
    prompt = Parameter("stored", name="prompt")
    with assign({prompt: "assigned"}):
        assert prompt.value == "assigned"
        assert prompt.stored_value == "stored"
    assert prompt.value == "stored"


def test_assign_by_name():
    prompt = Parameter("stored", name="prompt")
    other = Parameter("other", name="other")
    with assign({"prompt": "by name"}):
        assert prompt.value == "by name"
        assert other.value == "other"
    assert prompt.value == "stored"


def test_assign_by_parameter_wins_over_assign_by_name():
    prompt = Parameter("stored", name="prompt")
    with assign({"prompt": "by name", prompt: "by object"}):
        assert prompt.value == "by object"


def test_nested_assignments_merge_and_the_inner_one_wins():
    a = Parameter("a0", name="a")
    b = Parameter("b0", name="b")
    with assign({a: "a1", b: "b1"}):
        with assign({b: "b2"}):
            assert (a.value, b.value) == ("a1", "b2")
            assert current_assignment() == {a: "a1", b: "b2"}
        assert (a.value, b.value) == ("a1", "b1")
    assert (a.value, b.value) == ("a0", "b0")
    assert current_assignment() == {}


def test_assign_is_undone_when_the_block_raises():
    prompt = Parameter("stored", name="prompt")
    with pytest.raises(RuntimeError):
        with assign({prompt: "assigned"}):
            raise RuntimeError("boom")
    assert prompt.value == "stored"


def test_assign_validates_before_setting_anything():
    k = Parameter(3, name="k", constraint=Constraint(max=5))
    prompt = Parameter("p", name="prompt")
    with pytest.raises(ParameterError, match="k: 9 is above the maximum 5"):
        with assign({prompt: "new", k: 9}):
            pytest.fail("the block must not run")
    assert prompt.value == "p" and k.value == 3
    with pytest.raises(TypeError, match="Parameter objects or names"):
        with assign({3: "x"}):
            pass


def test_assign_never_changes_stored_values():
    prompt = Parameter("stored", name="prompt")
    k = Parameter(1, name="k")
    with assign({prompt: "assigned", "k": 7}):
        assert prompt.stored_value == "stored"
        assert k.stored_value == 1
        assert (prompt.value, k.value) == ("assigned", 7)
    assert (prompt.stored_value, k.stored_value) == ("stored", 1)


def test_writing_a_value_inside_assign_changes_the_stored_value_only():
    prompt = Parameter("stored", name="prompt")
    with assign({prompt: "assigned"}):
        prompt.value = "written"
        assert prompt.value == "assigned"  # the override still wins inside the block
        assert prompt.stored_value == "written"
    assert prompt.value == "written"


# ----------------------------------------------------------------------- isolation


def _read_in_thread(param: Parameter, times: int) -> list:
    seen = []
    for _ in range(times):
        seen.append(param.value)
    return seen


async def test_concurrent_tasks_each_see_only_their_own_value():
    prompt = Parameter("stored", name="prompt")
    count = Parameter(0, name="count")
    rng = random.Random(1234)
    delays = {i: [rng.random() * 0.002 for _ in range(4)] for i in range(64)}
    seen: dict[int, list] = {}
    threads_used: set[int] = set()

    async def worker(i: int) -> None:
        mine = f"value-{i}"
        observations = []
        with assign({prompt: mine, count: i}):
            observations.append((prompt.value, count.value))
            await asyncio.sleep(0)
            observations.append((prompt.value, count.value))
            await asyncio.sleep(delays[i][0])
            observations.append((prompt.value, count.value))

            def sync_part():
                threads_used.add(threading.get_ident())
                return [(p, c) for p, c in zip(_read_in_thread(prompt, 3), _read_in_thread(count, 3))]

            observations.extend(await asyncio.to_thread(sync_part))
            await asyncio.sleep(delays[i][1])
            observations.append((prompt.value, count.value))
            # a child task inherits the assignment
            observations.append(await asyncio.create_task(_read_later(prompt, count, delays[i][2])))
            await asyncio.sleep(0)
            observations.append((prompt.value, count.value))
        observations.append((prompt.value, count.value))  # after the block: stored values
        seen[i] = observations

    await asyncio.gather(*(worker(i) for i in range(64)))

    assert len(seen) == 64
    for i, observations in seen.items():
        assert observations[:-1] == [(f"value-{i}", i)] * (len(observations) - 1), f"task {i} saw {observations}"
        assert observations[-1] == ("stored", 0)
    assert threads_used  # the sync part really ran in worker threads
    assert prompt.stored_value == "stored" and count.stored_value == 0
    assert prompt.value == "stored"


async def _read_later(prompt: Parameter, count: Parameter, delay: float):
    await asyncio.sleep(delay)
    return (prompt.value, count.value)


async def test_isolation_with_nested_assign_in_tasks_and_unassigned_tasks():
    prompt = Parameter("stored", name="prompt")
    results: dict[str, list] = {}
    gate = asyncio.Event()

    async def assigned(i: int) -> None:
        with assign({prompt: f"outer-{i}"}):
            await gate.wait()
            with assign({"prompt": f"inner-{i}"}):
                await asyncio.sleep(random.random() * 0.001)
                inner = [prompt.value, await asyncio.to_thread(lambda: prompt.value)]
            await asyncio.sleep(0)
            outer = prompt.value
        results[f"a{i}"] = [*inner, outer]

    async def unassigned(i: int) -> None:
        await gate.wait()
        values = [prompt.value]
        await asyncio.sleep(random.random() * 0.001)
        values.append(await asyncio.to_thread(lambda: prompt.value))
        results[f"u{i}"] = values

    tasks = [asyncio.create_task(assigned(i)) for i in range(20)] + [
        asyncio.create_task(unassigned(i)) for i in range(20)
    ]
    await asyncio.sleep(0)
    gate.set()  # every task is inside its block before any reads
    await asyncio.gather(*tasks)
    for i in range(20):
        assert results[f"a{i}"] == [f"inner-{i}", f"inner-{i}", f"outer-{i}"]
        assert results[f"u{i}"] == ["stored", "stored"]


def test_an_inner_assign_by_name_beats_an_outer_assign_by_object():
    prompt = Parameter("stored", name="prompt")
    other = Parameter("x", name="other")
    with assign({prompt: "outer", other: "outer-other"}):
        with assign({"prompt": "inner"}):
            assert prompt.value == "inner"
            assert other.value == "outer-other"
        assert prompt.value == "outer"
    with assign({"prompt": "outer"}):
        with assign({prompt: "inner"}):
            assert prompt.value == "inner"
        assert prompt.value == "outer"


# --- values must survive a JSON round trip ---------------------------------------------

@pytest.mark.parametrize("value, part", [
    (["a", {1, 2}], "item 1 of the value is a set"),
    ({1: "a"}, "key 1 of the value is a int"),
    ([b"bytes"], "item 0 of the value is a bytes"),
    ([float("nan")], "item 0 of the value is nan"),
    ({"k": [1.0, float("inf")]}, "item 1 of the value['k'] is inf"),
    (["ok", ("a", "b")], "item 1 of the value is a tuple"),
    ("caf\ud83d", "lone surrogate"),
    ({"deep": ["caf\udfff"]}, "lone surrogate"),
])
def test_values_json_cannot_hold_are_refused_at_construction_and_on_update(value, part):
    with pytest.raises(ParameterError, match=re.escape(part)):
        Parameter(value, name="p")
    kind = type(value) if not isinstance(value, str) else str
    holder = Parameter(kind(), name="p")
    with pytest.raises(ParameterError, match="survive a JSON round trip"):
        holder.value = value
    assert holder.value == kind()


def test_json_values_round_trip_through_a_checkpoint(tmp_path):
    from opto import Agent

    class Holder(Agent):
        def __init__(self):
            self.a = Parameter({"list": [1, 2.5, "x", None, True, {"n": []}], "emoji": "\U0001F600"})

    agent = Holder()
    agent.save(tmp_path / "v.json")
    agent.a.value = {}
    agent.load(tmp_path / "v.json")
    assert agent.a.value == {"list": [1, 2.5, "x", None, True, {"n": []}], "emoji": "\U0001F600"}


def test_loading_a_damaged_values_file_names_the_file_and_changes_nothing(tmp_path):
    from opto import Agent

    class Holder(Agent):
        def __init__(self):
            self.prompt = Parameter("be brief")

    agent = Holder()
    (tmp_path / "agent.json").write_text('{"prompt": 42}')
    with pytest.raises(ParameterError, match=r"agent\.json: prompt: expected a str, got int 42; nothing was changed"):
        agent.load(tmp_path / "agent.json")
    (tmp_path / "agent.json").write_text('{"promt": "x"}')
    with pytest.raises(KeyError, match=r"agent\.json: .*no parameter 'promt'"):
        agent.load(tmp_path / "agent.json")
    assert agent.prompt.value == "be brief"
