"""The Hub round trip on 127.0.0.1: a stock repo served by olah -> `fivefold convert ORG/stock DST --push-to-hub`
-> stock transformers alone (fivefold not importable) loads the pushed repo with trust_remote_code and gives
stock's logits -> one fine-tuning step, push_to_hub, reloaded the same way. Then the Hub options of convert, verify,
export, push and from_pretrained, and uploads that fail.

Each client step is a fresh interpreter (HF_ENDPOINT is read at import); the steps are few and each does several
things.
"""

import json
import os
import textwrap
from pathlib import Path

import pytest
import torch
import transformers
from hub_server import FrontHub, Olah, client_env, mirror_repo, olah_cli, one_line_error, run_client
from huggingface_hub import ModelCard

from fivefold.conversion.samples import build_stock_checkpoint

from helpers import WITHOUT_FIVEFOLD, read_tensors

pytestmark = pytest.mark.slow
TOKEN = "hf_fivefold_test_token"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    cli = olah_cli()
    if cli is None:
        if os.environ.get("CI"):
            pytest.fail("olah is not installed (README, Set up: the .olah environment); CI must run the Hub tests")
        pytest.skip("olah is not installed: run the README's set-up line for the .olah environment")
    root = tmp_path_factory.mktemp("hub")
    main = build_stock_checkpoint("bert", "BertForMaskedLM", root / "main")
    other = build_stock_checkpoint("bert", "BertForMaskedLM", root / "v2", seed=1)
    (root / "nested" / "sub").mkdir(parents=True)
    build_stock_checkpoint("gpt2", "GPT2LMHeadModel", root / "nested" / "sub")
    (root / "nested" / "README.md").write_text("the checkpoint lives in sub/\n")
    card = "---\nlicense: apache-2.0\nlanguage: [en]\ndatasets: [wikipedia]\n---\n\n# stock\n"
    (main / "README.md").write_text(card)
    (main / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghij"]) + "\n")
    (main / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    (main / "additional_chat_templates").mkdir()  # transformers 5's named templates
    (main / "additional_chat_templates" / "tool_use.jinja").write_text("{{ tools | length }}")
    mirrors = root / "mirrors"
    mirror_repo(mirrors, "org/stock", {"main": main, "v2": other})
    mirror_repo(mirrors, "org/nested", {"main": root / "nested"})
    olah = Olah(cli, root, mirrors)
    front = FrontHub(TOKEN, upstream=olah.url)
    front.root = root
    yield front
    front.close()
    olah.close()


def env(hub, name: str, token: str | None = TOKEN) -> dict:
    return client_env(hub.url, hub.root / f"home-{name}", token)


# A fivefold process running steps in turn, each reported in one JSON list: a CLI invocation (argv), or Python
# code that may set `out`. `fail commits on|off` turns the server's errors on or off.
FIVEFOLD_STEPS = textwrap.dedent(
    """
    import contextlib, io, json, os, sys, urllib.request
    import huggingface_hub.constants, torch
    import fivefold
    from fivefold.cli import main
    results = []
    for step in json.loads(sys.argv[1]):
        if isinstance(step, dict):
            out = None
            exec(step["python"])
            if not step.get("setup"):
                results.append({"out": out})
            continue
        if step[:2] == ["fail", "commits"]:
            urllib.request.urlopen(urllib.request.Request(
                f"{huggingface_hub.constants.ENDPOINT}/fivefold-test/fail-commits/{step[2]}", method="POST"))
            continue
        err, printed = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(printed):
            rc = main(step)
        results.append({"argv": step, "rc": rc, "stderr": err.getvalue(), "stdout": printed.getvalue()})
    print(json.dumps(results))
    """
)


def fivefold_steps(hub, name: str, *steps, token: str | None = TOKEN) -> list[dict]:
    done = run_client(FIVEFOLD_STEPS, env(hub, name, token), json.dumps(steps))
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# A process with stock transformers only: stock's logits on org/stock, ours on org/ff, one step, push, logits.
STOCK_ONLY = WITHOUT_FIVEFOLD.split("jobs_file, out_file")[0] + textwrap.dedent(
    """
    import json
    from pathlib import Path
    step, out = sys.argv[1], sys.argv[2]
    ids = torch.tensor([[2, 5, 7, 9, 11, 3], [2, 8, 4, 3, 0, 0]])
    mask = (ids != 0).long()
    ff = transformers.AutoModelForMaskedLM.from_pretrained("org/ff", trust_remote_code=True, revision="main")
    result = {"cls": type(ff).__name__, "module": type(ff).__module__}
    with torch.no_grad():
        result["ours"] = ff.eval()(input_ids=ids, attention_mask=mask).logits.tolist()
    stock = transformers.BertForMaskedLM.from_pretrained("org/stock", revision="main").eval()
    with torch.no_grad():
        result["stock"] = stock(input_ids=ids, attention_mask=mask).logits.tolist()
    ff.train()
    loss = ff(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
    loss.backward()
    torch.optim.SGD(ff.parameters(), lr=0.5).step()
    ff.push_to_hub("org/ff", commit_message="one fine-tuning step")
    with torch.no_grad():
        result["tuned"] = ff.eval()(input_ids=ids, attention_mask=mask).logits.tolist()
    # Reloaded the same way, downloaded afresh into an empty cache: what the Hub now holds.
    again = transformers.AutoModelForMaskedLM.from_pretrained(
        "org/ff", trust_remote_code=True, revision="main", cache_dir=step, force_download=True
    ).eval()
    result["commit"] = (Path(step) / "models--org--ff" / "refs" / "main").read_text()  # what it downloaded
    with torch.no_grad():
        result["reloaded"] = again(input_ids=ids, attention_mask=mask).logits.tolist()
    assert "fivefold" not in sys.modules
    json.dump(result, open(out, "w"))
    """
)


def stock_only(hub, name: str, tmp_path: Path) -> dict:
    out = tmp_path / f"{name}.json"
    done = run_client(STOCK_ONLY, env(hub, name), str(tmp_path / "fresh-cache"), str(out))
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def max_diff(a, b) -> float:
    """At the real tokens of the batch above (fivefold and stock differ where the logits are unused: at padding)."""
    real = torch.tensor([[1] * 6, [1] * 4 + [0] * 2]).bool()
    return float((torch.as_tensor(a) - torch.as_tensor(b)).abs()[real].max())


def test_convert_push_load_without_fivefold_finetune_push_reload(hub, fivefold_run, tmp_path):
    dst, convert = fivefold_run["round trip"]
    assert convert["rc"] == 0, convert["stderr"]
    pushed = hub.files("org/ff")
    assert set(pushed) == {".gitattributes", *(p.relative_to(dst).as_posix() for p in dst.rglob("*") if p.is_file())}
    assert {"config.json", "model.safetensors", "README.md", "vocab.txt"} <= set(pushed)
    assert {"chat_template.jinja", "additional_chat_templates/tool_use.jinja"} <= set(pushed)  # from the Hub too
    assert any(p.startswith("modeling_") and p.endswith(".py") for p in pushed)
    assert "auto_map" in json.loads(pushed["config.json"])
    assert hub.repos["org/ff"].messages == ["initial commit", "converted"]  # the folder whole, in one commit

    card = ModelCard(pushed["README.md"].decode())
    assert card.data.base_model == "org/stock"
    assert (card.data.license, card.data.language, card.data.datasets) == ("apache-2.0", ["en"], ["wikipedia"])
    assert card.data.tags == ["fivefold", "bert"] and card.data.pipeline_tag == "fill-mask"
    assert 'from_pretrained("org/ff", trust_remote_code=True)' in card.text

    first = stock_only(hub, "stock-only", tmp_path)
    assert first["cls"] == "FivefoldBertForMaskedLM" and first["module"].startswith("transformers_modules")
    assert max_diff(first["ours"], first["stock"]) <= 1e-4
    assert max_diff(first["tuned"], first["ours"]) > 1e-3  # the step changed the weights
    assert hub.repos["org/ff"].messages[-1] == "one fine-tuning step"
    assert any(p.startswith("modeling_") for p in hub.files("org/ff"))  # the code shipped again
    assert first["commit"] == hub.repos["org/ff"].branches["main"]
    assert max_diff(first["reloaded"], first["tuned"]) <= 1e-6


def ok(result: dict) -> dict:
    assert result.get("rc", 0) == 0, result
    return result


# Trainer(push_to_hub=True): one step of fine-tuning a fivefold model, then Trainer.push_to_hub.
TRAINER_PUSH = """
ids = torch.tensor([[2, 5, 7, 9, 11, 3]] * 4)
rows = [{"input_ids": row, "attention_mask": torch.ones_like(row), "labels": row} for row in ids]
model = fivefold.FivefoldBertForMaskedLM.from_pretrained("org/stock", revision="main")
args = transformers.TrainingArguments(
    output_dir=OUT, push_to_hub=True, hub_model_id="org/ff-trainer", hub_token=os.environ["HF_TOKEN"],
    max_steps=1, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
)
trainer = transformers.Trainer(model=model, args=args, train_dataset=rows)
trainer.train()
trainer.push_to_hub(commit_message="fine-tuned by Trainer")
out = trainer.state.log_history[-1]["train_loss"]
"""

LOGITS = """
ids = torch.tensor([[2, 5, 7, 9, 11, 3], [2, 8, 4, 3, 0, 0]])
model = fivefold.{cls}.from_pretrained({args}).eval()
with torch.no_grad():
    out = model(input_ids=ids, attention_mask=(ids != 0).long()).logits.tolist()
"""


@pytest.fixture(scope="module")
def fivefold_run(hub, tmp_path_factory):
    """Every fivefold-side step of this file, in one process: the round trip's convert and push first."""
    tmp_path = tmp_path_factory.mktemp("fivefold-steps")
    names = ("ff", "v2", "nested", "back", "py", "trainer", "bad", "dead", "broken", "none")
    d = {name: str(tmp_path / name) for name in names}
    results = fivefold_steps(
        hub,
        "fivefold",
        ["convert", "org/stock", d["ff"], "--push-to-hub", "org/ff", "--commit-message", "converted", "-q"],
        ["convert", "org/stock", d["v2"], "--revision", "v2", "--quiet"],
        ["push", d["v2"], "org/ff-v2", "--private", "--commit-message", "the v2 branch", "--token", TOKEN],
        ["verify", "org/stock", "org/ff-v2", "--revision", "v2"],  # both Hub ids; the second private (HF_TOKEN)
        ["export", "org/ff-v2", d["back"], "--quiet"],
        ["convert", "org/nested", d["nested"], "--subfolder", "sub", "--quiet"],
        {"python": LOGITS.format(cls="FivefoldBertForMaskedLM", args='"org/stock", revision="v2"')},
        {"python": LOGITS.format(cls="FivefoldGPT2LMHeadModel", args='"org/nested", subfolder="sub"')},
        {"python": f"fivefold.convert('org/stock', {d['py']!r}, progress=False, push_to_hub='org/ff-py')"},
        {"python": f"import transformers\nOUT = {d['trainer']!r}" + TRAINER_PUSH},
        ["convert", "org/stock", d["bad"], "--push-to-hub", "org/bad", "--token", "hf_wrong", "-q"],
        ["fail", "commits", "on"],
        ["push", d["v2"], "org/broken"],
        ["fail", "commits", "off"],
        {"python": "huggingface_hub.constants.ENDPOINT = 'http://127.0.0.1:9'", "setup": True},  # no network
        ["push", d["v2"], "org/dead"],
        {"python": "os.environ.pop('HF_TOKEN')", "setup": True},
        ["convert", "org/stock", d["none"], "--push-to-hub", "org/none"],
        ["convert", str(tmp_path / "missing" / "folder"), d["none"]],
    )
    return {"round trip": (Path(d["ff"]), results[0]), "options": (d, results[1:])}


def test_hub_options_and_failed_uploads(hub, fivefold_run):
    d, results = fivefold_run["options"]
    assert len(results) == 14, [r.get("argv") for r in results]
    convert_v2, push, verify, export, nested, bert_v2, gpt2_sub, python_push, trainer_push, *failures = results
    bad, broken, dead, none, missing = failures
    assert ok(convert_v2)["stdout"] == "" and ok(export)["stdout"] == ""  # --quiet
    v2_stock = hub.root / "v2"
    assert json.loads(Path(d["back"], "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    assert read_tensors(Path(d["back"])).keys() == read_tensors(v2_stock).keys()
    assert all(torch.equal(read_tensors(Path(d["back"]))[k], v) for k, v in read_tensors(v2_stock).items())
    assert ok(push)["stdout"].startswith("pushed") and hub.repos["org/ff-v2"].private
    assert hub.repos["org/ff-v2"].messages == ["initial commit", "the v2 branch"]
    assert "within" in ok(verify)["stdout"]
    assert ModelCard(hub.files("org/ff-v2")["README.md"].decode()).data.base_model == "org/stock"
    ok(nested)
    assert json.loads(Path(d["nested"], "config.json").read_text())["model_type"] == "fivefold_gpt2"
    assert ModelCard(Path(d["nested"], "README.md").read_text()).data.base_model == "org/nested"

    stock = transformers.BertForMaskedLM.from_pretrained(v2_stock).eval()
    ids = torch.tensor([[2, 5, 7, 9, 11, 3], [2, 8, 4, 3, 0, 0]])
    with torch.no_grad():
        expected = stock(input_ids=ids, attention_mask=(ids != 0).long()).logits
    assert max_diff(bert_v2["out"], expected) <= 1e-4
    assert torch.tensor(gpt2_sub["out"]).shape[:2] == (2, 6)
    assert python_push == {"out": None} and "config.json" in hub.files("org/ff-py")
    trained = hub.files("org/ff-trainer")  # Trainer(push_to_hub=True) ships the code with the weights
    assert {"config.json", "model.safetensors"} <= set(trained) and any(p.startswith("modeling_") for p in trained)
    assert "auto_map" in json.loads(trained["config.json"]) and isinstance(trainer_push["out"], float)
    assert hub.repos["org/ff-trainer"].messages[-1] == "fine-tuned by Trainer"

    one_line_error(bad, "org/bad", "nothing was pushed")
    one_line_error(broken, "org/broken", "nothing was pushed", "500")
    one_line_error(dead, "org/dead", "nothing was pushed")
    assert not {"org/bad", "org/broken", "org/dead"} & set(hub.repos)  # a repo made for a failed push is gone
    one_line_error(none, "needs a token")
    assert not Path(d["none"]).exists()  # the missing token is found before any work
    one_line_error(missing, "no such folder")
