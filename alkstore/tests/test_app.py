"""Tasks and the App (docs/tasks-and-workers.md "Tasks")."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import alkstore
from alkstore import App, QueueOpts, Task, UnknownEngineError, ValidationError
from alkstore.runtime.task import default_task_name, parse_task_payload, task_payload


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'app.db'}"


@pytest.fixture
def app(url: str) -> App:
    with App(url) as made:
        yield made


def add(a: int, b: int = 0) -> int:
    """Add two numbers."""
    return a + b


def test_the_store_opens_on_first_use_only() -> None:
    app = App("nosuch://anywhere")
    app.task(add)
    assert app.url == "nosuch://anywhere"
    with pytest.raises(UnknownEngineError):
        _ = app.store


def test_url_defaults_to_the_environment_then_the_embedded_file(
    monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    monkeypatch.delenv("ALKSTORE_URL", raising=False)
    assert App().url == alkstore.DEFAULT_URL
    monkeypatch.setenv("ALKSTORE_URL", url)
    app = App()
    assert app.url == url
    with app:
        assert app.store is app.store
        monkeypatch.setenv("ALKSTORE_URL", "sqlite:///elsewhere.db")
        assert app.url == url  # resolved once, when the store opened


def test_configure_before_first_use_only(url: str, tmp_path: Path) -> None:
    app = App("sqlite:///never.db")
    app.configure(url)
    assert app.url == url
    with app:
        _ = app.store
        with pytest.raises(RuntimeError, match="already open"):
            app.configure(f"sqlite:///{tmp_path / 'other.db'}")
    assert not Path("never.db").exists()


def test_an_app_over_a_given_store_leaves_it_open(url: str) -> None:
    with alkstore.open(url) as store:
        app = App(store=store)
        assert app.store is store
        assert app.url == ""
        app.close()
        assert not store.closed
        with pytest.raises(RuntimeError):
            app.configure(url)
    with pytest.raises(ValidationError, match="either"):
        App(url, store=store)
    with pytest.raises(ValidationError, match="Store"):
        App(store="not a store")  # type: ignore[arg-type]
    # A URL that is not a str is refused at once, not at the first enqueue.
    with pytest.raises(ValidationError, match="url must be a str, not int"):
        App(5)  # type: ignore[arg-type]


def test_register_with_and_without_parentheses(app: App) -> None:
    plain = app.task(add)
    assert isinstance(plain, Task)
    assert plain.name == f"{__name__}.add"
    assert plain.queue == "default"

    @app.task(queue="maths", name="mul")
    def mul(a: int, b: int) -> int:
        return a * b

    assert (mul.name, mul.queue) == ("mul", "maths")
    assert app.tasks == {plain.name: plain, "mul": mul}
    assert app.queue_names == ["default", "maths"]


def test_calling_a_task_runs_the_function_in_process(app: App) -> None:
    task = app.task(add)
    assert task(2, b=3) == 5
    assert task.__doc__ == "Add two numbers."
    assert task.__name__ == "add"
    assert task.__wrapped__ is add


def test_registration_errors(app: App) -> None:
    app.task(add)
    with pytest.raises(ValidationError, match="already registered"):
        app.task(add)
    with pytest.raises(ValidationError, match="queue name"):
        app.task(queue="bad name")
    with pytest.raises(ValidationError, match="reserved"):
        app.task(queue="__alkstore_x")
    with pytest.raises(ValidationError, match="max_attempts"):
        app.task(queue="q", max_attempts=0)
    with pytest.raises(ValidationError, match=r"unknown queue option.*visibility"):
        app.task(queue="q", visibility=3)
    with pytest.raises(ValidationError, match="non-empty"):
        app.task(name="")(add)
    with pytest.raises(ValidationError, match="callable"):
        app.task(name="x")(42)  # type: ignore[arg-type]


def test_tasks_on_one_queue_share_its_options(app: App) -> None:
    app.task(queue="q", name="a")(add)
    app.task(queue="q", name="b", max_attempts=3)(add)
    app.task(queue="q", name="c", max_attempts=3)(add)
    app.task(queue="q", name="d")(add)
    assert app.queue_opts("q") == QueueOpts(max_attempts=3)
    assert app.queue("q").opts == QueueOpts(max_attempts=3)
    with pytest.raises(ValidationError, match="already has options"):
        app.task(queue="q", name="e", max_attempts=4)(add)
    assert "e" not in app.tasks
    assert app.queue_opts("unknown") == QueueOpts()


def test_options_returns_a_configured_copy(app: App) -> None:
    task = app.task(add)
    later = task.options(delay=5, priority=2)
    again = later.options(priority=9, max_attempts=2)
    assert task.enqueue_options == {}
    assert later.enqueue_options == {"delay": 5, "priority": 2}
    assert again.enqueue_options == {"delay": 5, "priority": 9, "max_attempts": 2}
    assert (again.name, again.queue, again.func) == (task.name, task.queue, task.func)
    assert "priority=9" in repr(again)
    for bad in ({"delay": -1}, {"priority": True}, {"run_at": "tomorrow"}, {"expires": 0}):
        with pytest.raises(ValidationError):
            task.options(**bad)


def test_enqueue_stores_the_task_payload(app: App) -> None:
    task = app.task(add)
    job_id = task.enqueue(1, b=2)
    job = app.queue("default").get_job(job_id)
    assert job is not None
    assert job.payload == {"task": task.name, "args": [1], "kwargs": {"b": 2}}
    assert job.payload == task.payload(1, b=2)
    assert job.content_type == "application/json"


def test_enqueue_with_options(app: App) -> None:
    task = app.task(queue="q", visibility_timeout_s=7)(add)
    job = app.queue("q").get_job(task.options(priority=4, max_attempts=2, delay=60).enqueue(1))
    assert job is not None
    assert (job.priority, job.max_attempts, job.visibility_timeout_s) == (4, 2, 7)
    assert job.run_at > job.enqueued_at
    assert app.queue("q").stats().scheduled == 1


def test_arguments_that_are_not_json_are_refused_before_anything_is_stored(app: App) -> None:
    task = app.task(add)
    for bad in ((1, 2), {1, 2}, b"raw", float("inf"), {3: "x"}):
        with pytest.raises(ValidationError):
            task.enqueue(bad)
    with pytest.raises(ValidationError):
        task.enqueue_many([(1,), (object(),)])
    with pytest.raises(ValidationError, match="list or tuple"):
        task.enqueue_many([1])  # type: ignore[list-item]
    # As Queue.enqueue_many: not an iterable of calls, a ValidationError.
    for not_calls in (None, 5, "ab", b"ab", {"a": 1}):
        with pytest.raises(ValidationError, match="calls must be an iterable"):
            task.enqueue_many(not_calls)  # type: ignore[arg-type]
    assert tuple(app.queue("default").stats()) == (0, 0, 0, 0)


def test_a_bytes_argument_is_refused_saying_what_an_argument_may_be(app: App) -> None:
    """Task arguments live inside the JSON payload, where bytes cannot: the
    message must not say that payloads may be bytes."""
    task = app.task(add)
    for call, where in (
        (lambda: task.enqueue(b"x"), "payload['args'][0]"),
        (lambda: task.enqueue(1, b=b"x"), "payload['kwargs']['b']"),
        (lambda: task.enqueue({"a": b"x"}), "payload['args'][0]['a']"),
    ):
        with pytest.raises(ValidationError) as caught:
            call()
        assert str(caught.value) == (
            f"{where} is of type bytes; a value inside a JSON payload (task arguments "
            "included) is a dict, list, str, int, float, bool or None of exactly those "
            "types (subclasses and tuples are refused); bytes can be a payload only on "
            "their own, never inside JSON: encode them as text first (base64, say)"
        )
    assert tuple(app.queue("default").stats()) == (0, 0, 0, 0)


def test_enqueue_many_is_one_call_per_item(app: App) -> None:
    task = app.task(add)
    ids = task.options(priority=3).enqueue_many([(1,), [2, 3]])
    jobs = [app.queue("default").get_job(i) for i in ids]
    assert [j.payload["args"] for j in jobs if j] == [[1], [2, 3]]
    assert all(j is not None and j.priority == 3 for j in jobs)
    assert task.enqueue_many([]) == []


def test_enqueue_many_names_the_refused_call_and_stores_nothing(app: App) -> None:
    task = app.task(add)
    refusals = {
        r"calls\[1\]: each call must be a list or tuple": [(1,), 2],
        r"calls\[2\]: task '": [(1,), (2,), (1, 2, 3, 4)],
        r"payloads\[1\]: payload\['args'\]\[0\] is of type set": [(1,), ({2},)],
    }
    for said, calls in refusals.items():
        with pytest.raises(ValidationError, match=f"^{said}"):
            task.enqueue_many(calls)
    assert tuple(app.queue("default").stats()) == (0, 0, 0, 0)


def test_enqueue_tx_uses_the_callers_transaction(app: App, url: str) -> None:
    import sqlite3

    task = app.task(add)
    path = url.removeprefix("sqlite:///")
    _ = app.store  # creates the schema
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        conn.execute("BEGIN")
        job_id = task.options(priority=5).enqueue_tx(conn, 1, b=1)
        conn.execute("ROLLBACK")
        assert app.queue("default").get_job(job_id) is None
        conn.execute("BEGIN")
        job_id = task.enqueue_tx(conn, 2)
        conn.execute("COMMIT")
    finally:
        conn.close()
    job = app.queue("default").get_job(job_id)
    assert job is not None
    assert job.payload["args"] == [2]


def test_close_then_use_reopens(app: App) -> None:
    task = app.task(add)
    first = app.store
    app.close()
    assert first.closed
    assert app.queue("default").get_job(task.enqueue(1)) is not None
    assert app.store is not first


def test_task_payload_helpers() -> None:
    payload = task_payload("t", (1, 2), {"k": "v"})
    assert payload == {"task": "t", "args": [1, 2], "kwargs": {"k": "v"}}
    assert parse_task_payload(payload) == ("t", [1, 2], {"k": "v"})
    assert parse_task_payload({"task": "bare"}) == ("bare", [], {})
    for bad, message in (
        ([1], "not a task payload"),
        ({"args": []}, '"task"'),
        ({"task": ""}, '"task"'),
        ({"task": "t", "args": {}}, '"args"'),
        ({"task": "t", "kwargs": []}, '"kwargs"'),
        (b"bytes", "not a task payload"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_task_payload(bad)


def test_default_names_of_script_functions_follow_the_module_name(tmp_path: Path) -> None:
    """A function in a script run as ``python jobs.py`` is named ``jobs.f``,
    as ``alkstore worker jobs:app`` would import it."""
    script = tmp_path / "jobs.py"
    script.write_text(
        textwrap.dedent(
            """
            from alkstore.runtime.task import default_task_name
            def f(): pass
            class C:
                def m(self): pass
            print(default_task_name(f), default_task_name(C.m))
            """
        )
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["jobs.f", "jobs.C.m"]
    assert default_task_name(add) == f"{__name__}.add"


PACKAGED_JOBS = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import alkstore

    app = alkstore.App()
    HERE = Path(__file__).parent

    @app.task(queue="q")
    def hello(name):
        (HERE / f"hello-{name}").write_text(name)

    if __name__ == "__main__":
        print(hello.name)
        with app:
            hello.enqueue(sys.argv[1])
    """
)


def test_a_script_run_by_path_inside_a_package_enqueues_what_the_worker_runs(
    tmp_path: Path,
) -> None:
    """``python proj/jobs.py`` names its tasks ``proj.jobs.*``, as ``alkstore
    worker proj.jobs:app`` imports them, so the worker runs its job."""
    package = tmp_path / "proj"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "jobs.py").write_text(PACKAGED_JOBS)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
    environ["ALKSTORE_URL"] = f"sqlite:///{tmp_path / 'jobs.db'}"

    def run(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, *args],
            check=False,
            cwd=tmp_path,
            env=environ,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout + result.stderr

    assert run("proj/jobs.py", "ada").split() == ["proj.jobs.hello"]
    assert run("-m", "proj.jobs", "bob").split() == ["proj.jobs.hello"]
    log = run("-m", "alkstore", "worker", "proj.jobs:app", "--burst")
    assert log.count("(proj.jobs.hello) succeeded") == 2, log
    assert (package / "hello-ada").read_text() == "ada"
    assert (package / "hello-bob").read_text() == "bob"


def test_default_names_of_scripts_walk_up_the_enclosing_packages(tmp_path: Path) -> None:
    """Each enclosing folder with an ``__init__.py`` is a package; the walk
    stops at the first without one (or whose name is no identifier)."""
    code = "from alkstore.runtime.task import default_task_name\ndef f(): pass\n"
    code += "print(default_task_name(f))\n"
    layout = {
        "top/a/b/jobs.py": "a.b.jobs.f",  # top has no __init__.py
        "top/a/b/__init__.py": "a.b.f",
        "top/a/plain/jobs.py": "jobs.f",  # plain has no __init__.py
        "top/a/not-an-identifier/jobs.py": "jobs.f",
        "loose.py": "loose.f",
    }
    for folder in ("top/a", "top/a/b", "top/a/not-an-identifier"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "top/a/plain").mkdir()
    for script in layout:
        path = tmp_path / script
        path.write_text((path.read_text() if path.exists() else "") + code)
    for script, expected in layout.items():
        out = subprocess.run(
            [sys.executable, script], cwd=tmp_path, capture_output=True, text=True, check=True
        ).stdout
        assert out.split() == [expected], script


def test_enqueue_checks_the_call_against_the_function(app: App, url: str) -> None:
    """A misspelled keyword, a missing argument or one too many is refused
    at enqueue, naming it; nothing is stored."""
    import sqlite3

    task = app.task(add)
    with pytest.raises(ValidationError, match=r"task '.*add'.*unexpected keyword.*'c'"):
        task.enqueue(1, c=2)
    with pytest.raises(ValidationError, match="missing a required argument: 'a'"):
        task.enqueue()
    with pytest.raises(ValidationError, match="too many positional"):
        task.enqueue_many([(1, 2), (1, 2, 3)])
    with pytest.raises(ValidationError, match=r"'dealy'.*options\(delay=\.\.\.\)"):
        task.enqueue(1, dealy=5)
    with pytest.raises(ValidationError, match="unexpected keyword"):
        task.payload(1, b=2, priorty=3)

    _ = app.store
    conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None, timeout=30)
    try:
        conn.execute("BEGIN")
        with pytest.raises(ValidationError, match=r"'max_attempt'.*options\(max_attempts="):
            task.enqueue_tx(conn, 1, max_attempt=3)
        assert conn.in_transaction  # the caller's transaction is untouched
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    assert tuple(app.queue("default").stats()) == (0, 0, 0, 0)

    # Still accepted: keywords the function has, **kwargs, unsigned builtins.
    assert task.payload(1, b=2)["kwargs"] == {"b": 2}

    @app.task(name="anything")
    def anything(*args: object, **kwargs: object) -> None:
        pass

    assert anything.payload(1, delay=2)["kwargs"] == {"delay": 2}
    assert app.task(name="printer")(print).payload("x", sep="-")["kwargs"] == {"sep": "-"}


# -- takes_context (docs/tasks-and-workers.md "Job context") --------------------


def test_a_task_taking_the_context_is_enqueued_without_it(app: App) -> None:
    """``takes_context=True``: the enqueue arguments are checked against the
    function less its first parameter, by every enqueue path and by its
    ``options()`` copies; a plain call stays a plain call."""

    @app.task(name="ctx", takes_context=True)
    def with_context(context: alkstore.JobContext, a: int, b: int = 0) -> int:
        return a + b

    assert with_context.takes_context
    assert not app.task(add).takes_context
    assert with_context.payload(1, b=2) == {"task": "ctx", "args": [1], "kwargs": {"b": 2}}
    with pytest.raises(ValidationError, match=r"task 'ctx' cannot be called .*missing .*'a'"):
        with_context.enqueue()
    with pytest.raises(ValidationError, match=r"task 'ctx' cannot be called .*too many positional"):
        with_context.enqueue(1, 2, 3)
    with pytest.raises(ValidationError, match=r"calls\[1\]: task 'ctx' .*too many positional"):
        with_context.enqueue_many([(1,), (1, 2, 3)])
    later = with_context.options(priority=3)
    assert later.takes_context
    with pytest.raises(ValidationError, match="too many positional"):
        later.payload(1, 2, 3)
    assert tuple(app.queue("default").stats()) == (0, 0, 0, 0)
    assert with_context.func("a context", 2, b=3) == 5  # type: ignore[arg-type]
    assert with_context("a context", 2, b=3) == 5  # type: ignore[call-arg]


def test_takes_context_needs_a_positional_first_parameter(app: App) -> None:
    def nothing() -> None:
        pass

    def keywords_only(*, a: int) -> None:
        pass

    def any_keywords(**kwargs: object) -> None:
        pass

    for function in (nothing, keywords_only, any_keywords):
        with pytest.raises(
            ValidationError,
            match=r"task 'refused' has takes_context=True, .*no positional first parameter",
        ):
            app.task(name="refused", takes_context=True)(function)
    assert "refused" not in app.tasks
    assert app.queue_names == []  # nothing registered, not even the queue
    with pytest.raises(ValidationError, match="takes_context must be a bool, not str"):
        app.task(name="x", takes_context="yes")  # type: ignore[call-overload]

    def anything(*args: object) -> None:
        pass

    # *args takes the context and the enqueued arguments alike.
    assert app.task(name="star", takes_context=True)(anything).payload(1, 2)["args"] == [1, 2]


def test_a_misspelled_option_names_the_keyword(app: App) -> None:
    task = app.task(add)
    with pytest.raises(TypeError, match="unexpected keyword argument 'dealy'"):
        task.options(dealy=5)  # type: ignore[call-arg]


# -- unique jobs (docs/tasks-and-workers.md "Unique jobs") -------------------------


def test_a_task_unique_by_its_arguments_keeps_one_live_job_per_call(app: App) -> None:
    task = app.task(unique_key=True)(add)
    first = task.enqueue(1, b=2)
    assert task.enqueue(1, 2) == first  # the same call, bound to the signature
    assert task.enqueue(a=1, b=2) == first
    other = task.enqueue(1)
    assert other != first
    assert task.enqueue(1, b=0) == other  # the default applied
    queue = app.queue("default")
    key = queue.get_job(first).unique_key  # type: ignore[union-attr]
    assert key is not None
    assert len(key) == 64
    assert int(key, 16) >= 0
    assert queue.stats().pending == 2
    handle = queue.claim_one("w")
    assert handle is not None
    assert handle.ack()
    assert task.enqueue(1, b=2) not in (first, other)  # its key is free again


def test_a_task_with_a_fixed_key_has_one_live_job_and_options_can_override_it(
    app: App,
) -> None:
    task = app.task(unique_key="nightly-report")(add)
    first = task.enqueue(1)
    assert task.enqueue(2) == first
    assert task.options(unique_key="other").enqueue(3) != first
    assert task.options(priority=5).enqueue(4) == first  # the rule survives options()
    assert app.queue("default").stats().pending == 2


def test_a_key_rule_is_called_with_the_enqueue_arguments(app: App) -> None:
    seen: list[tuple[object, ...]] = []

    def by_user(a: int, b: int = 0) -> str | None:
        seen.append((a, b))
        return None if a < 0 else f"user:{a}"

    task = app.task(unique_key=by_user)(add)
    first = task.enqueue(7, b=1)
    assert task.enqueue(7, b=2) == first
    assert task.enqueue(-1) != task.enqueue(-1)  # no key: two jobs
    ids = task.enqueue_many([[7], [8], [8, 1], [-1]])
    assert ids[0] == first
    assert ids[1] == ids[2] != first
    assert len(set(ids)) == 3
    assert seen[:2] == [(7, 1), (7, 2)]


def test_bad_unique_rules_and_keys_are_refused(app: App) -> None:
    for bad in (7, b"k", "", "k" * 256):
        with pytest.raises(ValidationError, match="unique_key"):
            app.task(name=f"bad{bad!r}", unique_key=bad)(add)
    with pytest.raises(ValidationError, match="unique_key"):
        app.task(add).options(unique_key="")
    task = app.task(name="returns_an_int", unique_key=lambda a, b=0: a)(add)
    with pytest.raises(ValidationError, match="the key the unique_key function of task"):
        task.enqueue(1)
    wrong = app.task(name="takes_nothing", unique_key=lambda: "k")(add)
    with pytest.raises(ValidationError, match="unique_key function of task 'takes_nothing' raised"):
        wrong.enqueue(1)
    assert app.queue("default").stats().pending == 0


# -- relays (docs/outbox.md) ----------------------------------------------------


def test_relay_registers_an_outbox_apart_from_the_task_queues(app: App) -> None:
    def publish(message: object) -> None:
        pass

    app.task(add)
    assert app.relay("outbox.orders", max_attempts=20, backoff_cap_s=600)(publish) is publish
    assert app.relays == {"outbox.orders": publish}
    assert app.queue_names == ["default"]  # a worker claims no message as a task
    assert app.queue_opts("outbox.orders") == QueueOpts(max_attempts=20, backoff_cap_s=600)
    outbox = app.outbox("outbox.orders")
    assert isinstance(outbox, alkstore.Outbox)
    assert (outbox.queue.name, outbox.queue.opts) == (
        "outbox.orders",
        QueueOpts(max_attempts=20, backoff_cap_s=600),
    )
    relays = app.relays
    relays.clear()  # a copy
    assert list(app.relays) == ["outbox.orders"]


def test_relay_registration_errors(app: App) -> None:
    app.task(queue="tasks", name="t")(add)
    app.relay("outbox.x")(print)
    with pytest.raises(ValidationError, match="queue 'tasks' holds tasks; an outbox needs its own"):
        app.relay("tasks")(print)
    with pytest.raises(
        ValidationError, match=r"queue 'outbox\.x' is an outbox with a relay; tasks need their own"
    ):
        app.task(queue="outbox.x", name="u")(add)
    assert "u" not in app.tasks
    with pytest.raises(ValidationError, match=r"queue 'outbox\.x' already has a relay"):
        app.relay("outbox.x")(print)
    with pytest.raises(ValidationError, match="a relay must be callable, not int"):
        app.relay("outbox.y")(42)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=r"unknown queue option.*visibility"):
        app.relay("outbox.y", visibility=3)
    with pytest.raises(ValidationError, match="max_attempts"):
        app.relay("outbox.y", max_attempts=0)
    with pytest.raises(ValidationError, match="queue name 'bad name'"):
        app.relay("bad name")
    # None of the refused registrations left anything behind.
    assert list(app.relays) == ["outbox.x"]
    assert app.queue_names == ["tasks"]
    app.relay("outbox.y")(print)
    assert sorted(app.relays) == ["outbox.x", "outbox.y"]
