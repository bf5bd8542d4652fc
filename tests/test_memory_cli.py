"""``mlotspark memory`` says what it did: forget confirms or refuses before deleting
anything, add names a duplicate's id, search hides weak hits unless ``--all``, reindex
counts what it re-embedded."""

from __future__ import annotations

import json

from mlotspark.cli.entry import main


def out_of(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["memory", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def ids(capsys) -> dict[str, int]:
    _, out, _ = out_of(capsys, "list", "--json")
    return {e["text"]: e["id"] for e in json.loads(out)}


def test_add_says_the_id_and_a_duplicate_says_it_exists(capsys):
    code, out, _ = out_of(capsys, "add", "My sister's name is Ilse.")
    first = ids(capsys)["My sister's name is Ilse."]
    assert code == 0 and out.strip() == f"remembered #{first}: My sister's name is Ilse."
    code, out, _ = out_of(capsys, "add", "my sister's name is ilse")  # same fact, other case/punctuation
    assert code == 0 and out.strip() == f"already remembered as #{first}: My sister's name is Ilse."
    assert len(ids(capsys)) == 1


def test_add_refuses_a_retraction_rather_than_keeping_it_as_a_fact(capsys):
    out_of(capsys, "add", "I have a cat called Luna.")
    code, out, err = out_of(capsys, "add", "Forget that I have a cat called Luna.")
    assert code == 2 and not out and "memory forget" in err and len(err.strip().splitlines()) == 1
    assert list(ids(capsys)) == ["I have a cat called Luna."]


def test_forget_confirms_each_and_refuses_all_if_one_id_is_unknown(capsys):
    for text in ("I live in Ghent.", "I play the cello."):
        out_of(capsys, "add", text)
    known = ids(capsys)
    a, b = known["I live in Ghent."], known["I play the cello."]
    code, _, err = out_of(capsys, "forget", str(a), "999")
    assert code == 2 and "999" in err and "nothing deleted" in err
    assert ids(capsys) == known  # nothing was deleted
    code, out, _ = out_of(capsys, "forget", str(a), str(b))
    assert code == 0 and out.splitlines() == [f"forgot #{a}: I live in Ghent.", f"forgot #{b}: I play the cello."]
    assert ids(capsys) == {}


def test_search_shows_the_top_k_with_scores_and_no_floor(capsys):
    out_of(capsys, "add", "My sister's name is Ilse.")
    out_of(capsys, "add", "The bakery on the corner opens at seven.")
    _, out, _ = out_of(capsys, "search", "my sister name", "--json")
    hits = json.loads(out)
    assert [h["text"] for h in hits] == ["My sister's name is Ilse.", "The bakery on the corner opens at seven."]
    assert hits[0]["score"] > hits[1]["score"] >= 0.0  # the weak hit shown with its score, not hidden
    _, out, _ = out_of(capsys, "search", "my sister name", "-k", "1")
    assert "Ilse" in out and "bakery" not in out and "0." in out


def test_reindex_after_switching_embedder_counts_the_entries_it_embedded(capsys, monkeypatch):
    out_of(capsys, "add", "My sister's name is Ilse.")
    out_of(capsys, "add", "I play the cello.")
    from mlotspark.memory.semantic import HashingEmbedder, store

    monkeypatch.setattr(store, "default_embedder", lambda: HashingEmbedder(dim=256))  # "another embedder"
    code, out, _ = out_of(capsys, "reindex")
    assert code == 0 and out.strip() == "2 entries re-embedded with hashing-v1-256; 2 in the store"
    code, out, _ = out_of(capsys, "reindex")
    assert out.strip() == "0 entries re-embedded with hashing-v1-256; 2 in the store"


def _green_then_purple_forgotten(store) -> None:
    """Green superseded by purple (a writer's supersede), then purple forgotten as a chat turn asks."""
    from mlotspark.memory.semantic import Operation, learn_turn

    old = store.remember("My favourite colour is green.")
    store.apply([Operation("supersede", "My favourite colour is purple.", ids=(old,))])
    assert store.get(old).superseded_by is not None
    gone = learn_turn(store, "Forget that my favourite colour is purple.").forgotten
    assert [e.text for e in gone] == ["My favourite colour is purple."]


def test_list_shows_current_entries_and_history_the_superseded_with_a_forgotten_successor(capsys):
    """A request to forget takes the entry it names; the value it had replaced stays superseded:
    ``list`` leaves it out, ``list --history`` says its successor is gone."""
    from mlotspark.memory.semantic import SemanticStore

    with SemanticStore() as store:
        _green_then_purple_forgotten(store)
    _, out, _ = out_of(capsys, "list")
    assert "green" not in out and "purple" not in out
    _, out, _ = out_of(capsys, "list", "--history")
    assert "[superseded by an entry forgotten since on" in out and "green" in out and "purple" not in out


def test_an_entry_whose_successor_was_retracted_stays_superseded_through_export_and_import(tmp_path):
    from mlotspark.memory.semantic import SemanticStore

    with SemanticStore(tmp_path / "a.db") as store:
        _green_then_purple_forgotten(store)
        assert store.export_json(tmp_path / "m.json") == 1
    with SemanticStore(tmp_path / "b.db") as other:
        other.import_json(tmp_path / "m.json")
        (green,) = other.list()
        assert not green.current and other.search("my favourite colour", k=3) == []
