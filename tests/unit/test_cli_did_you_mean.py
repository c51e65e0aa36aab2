"""The CLI's answer to a mistyped name (``pgqueue.cli.shared.did_you_mean``): the registered
``module.function`` names of a bare function name, capped, else the closest spelling, else
nothing."""

from __future__ import annotations

from pgqueue.cli.shared import did_you_mean


def test_a_function_name_gets_its_registered_names() -> None:
    assert did_you_mean("noop", ["shop.noop", "shop.fail"]) == "did you mean 'shop.noop'?"
    assert (
        did_you_mean("send", ["b.send", "a.send", "mail"]) == "did you mean 'a.send' or 'b.send'?"
    )


def test_many_of_one_function_name_are_capped() -> None:
    known = [f"app{n}.send" for n in range(30)]
    assert did_you_mean("send", known) == (
        "did you mean 'app0.send' or 'app1.send' or 'app10.send' (or another of that name)?"
    )


def test_a_misspelling_gets_the_closest_name_only() -> None:
    assert did_you_mean("mial", ["mail", "email", "maintenance"]) == "did you mean 'mail'?"


def test_nothing_close_or_nothing_known_gets_nothing() -> None:
    assert did_you_mean("nosuch", ["mail"]) == ""
    assert did_you_mean("mail", []) == ""
