"""`reinforge report`: one self-contained HTML page of a run, checked as text and rendered in headless Chromium."""

import base64
import html
import json
import random
import re

import pytest
from headless_browser import dump_dom, find_browser

from reinforge.errors import ReinforgeError
from reinforge.track.report import FAMILIES, write_report

IMG = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)" alt="([^"]*)">')
SECTIONS = ("summary", "plots", "eval", "samples", "config")
HOSTILE = '<script>alert("pwned")</script> & <b>bold</b>'


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """A real 4-step run of the default recipe (tiny model), with pass@k before/after (eval.json, passk.png)."""
    from reinforge.config import load_config
    from reinforge.orchestrate.run import train

    out = tmp_path_factory.mktemp("runs")
    cfg = load_config(None, [f"output_dir={out}", "name=tiny", "train.steps=4", "eval.every=2",
                             "rollout.prompts_per_step=4", "rollout.group_size=4", "task.heldout_size=10",
                             "eval.final_samples=4", "train.time_limit_s=0"])
    return train(cfg).run_dir


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _synthetic_run(path, keys, steps=5, seed=0, samples=True):
    """A run directory written by hand: metrics for ``keys``, samples with hostile text, config, no eval."""
    rng = random.Random(seed)
    path.mkdir(parents=True)
    rows = [{"step": s, **{k: rng.random() for k in keys}} for s in range(1, steps + 1)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if samples:
        sample_rows = [{"step": s, "task_id": f"t{s}-{i}", "prompt": f"{s}+{i}=", "reward": float(i % 2),
                        "completion": HOSTILE if i == 0 else f"answer {i}", "finish_reason": "stop"}
                       for s in range(1, steps + 1) for i in range(3)]
        (path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sample_rows))
    (path / "config.yaml").write_text(f"name: {path.name}\ntask:\n  system_prompt: '{HOSTILE}'\n")
    return rows


def _all_keys():
    return [k for f in FAMILIES for k, _ in f.keys] + ["reward/std"] + [f.twin[0] for f in FAMILIES if f.twin]


# ------------------------------------------------------------------------------- the page as text
def test_report_of_a_real_run_has_every_section_and_embeds_its_pngs(real_run):
    page_path = write_report(real_run)
    assert page_path == real_run / "report.html"
    page = page_path.read_text()
    for section in SECTIONS:
        assert f'<section id="{section}">' in page
    # every PNG beside the page is embedded byte for byte, and every embedded image is one of them
    pngs = {p.name: p.read_bytes() for p in (real_run / "report").glob("*.png")}
    embedded = [base64.b64decode(data) for data, _ in IMG.findall(page)]
    assert len(embedded) == len(pngs) == page.count("<img ")
    assert sorted(embedded) == sorted(pngs.values())
    assert all(png.startswith(b"\x89PNG\r\n\x1a\n") for png in embedded)
    # one figure for each family that has a metric in metrics.jsonl; the others are named as skipped
    records = _metrics(real_run)
    logged = {k for r in records for k in r}
    moving = {k for r in records for k, v in r.items() if isinstance(v, int | float) and v != 0}
    for family in FAMILIES:
        has_data = any(k in moving for k, _ in family.keys)  # a metric at 0 every step is not drawn (below)
        assert (f"{family.slug}.png" in pngs) == has_data, family.slug
        if not has_data:  # named as absent ("Not plotted") or as 0 at every step ("Not drawn")
            notes = page.split('<section id="plots">')[1].split("</section>")[0].split('<p class="note">', 1)[1]
            assert html.escape(family.title) in notes
        if has_data:
            missing = [k for k, _ in family.keys if k not in logged]
            caption = page.split(f"({family.slug}.png)")[1].split("</figcaption>")[0]
            assert caption == (f"; not logged: {', '.join(missing)}" if missing else "")
    assert {"reward.png", "heldout.png", "step_time.png", "throughput.png"} <= set(pngs)
    # pass@k curve and eval table (eval.final_samples=4 -> pass@1..4 before and after)
    assert (real_run / "passk.png").read_bytes() == pngs["passk.png"]
    ev = json.loads((real_run / "eval.json").read_text())
    for when in ("before", "after"):
        assert f"<th>{when}</th>" in page
        for k in ev[when]["pass_at_k"]:
            assert f"<th>pass@{k}</th>" in page
    # the summary is computed from metrics.jsonl
    train_rows = [r for r in records if "reward/mean" in r]
    evals = [r for r in records if "eval/heldout_acc" in r]
    summary = page.split('<section id="summary">')[1].split("</section>")[0]
    assert f"<th>steps</th><td>{max(r['step'] for r in records)}</td>" in summary
    assert f"{train_rows[-1]['reward/mean']:.4f}" in summary
    assert f"before {evals[0]['eval/heldout_acc']:.4f}" in summary and f"after {evals[-1]['eval/heldout_acc']:.4f}" in summary
    assert "total time" in summary
    # the resolved config, escaped, in a <pre>
    config = page.split('<pre class="config">')[1].split("</pre>")[0]
    assert config == html.escape((real_run / "config.yaml").read_text(), quote=True)
    # samples from the first and the last training step, with their rewards
    samples = page.split('<section id="samples">')[1]
    steps = [json.loads(line)["step"] for line in (real_run / "samples.jsonl").read_text().splitlines()]
    for step in (min(steps), max(steps)):
        assert f'<td class="num">{step}</td>' in samples


def test_sample_text_and_config_are_escaped(tmp_path):
    run = tmp_path / "run"
    _synthetic_run(run, ["reward/mean"])
    page = write_report(run).read_text()
    escaped = html.escape(HOSTILE, quote=True)
    assert HOSTILE not in page and "alert(\"pwned\")" not in page
    assert page.count(escaped) >= 2 + 1  # first and last step's sample, and the config
    assert page.count("<script>") == 1  # the page's own image check only
    # only the first and last steps are shown
    assert "t1-0" in page and "t5-0" in page and "t3-0" not in page


def test_absent_metrics_are_skipped_and_said_so(tmp_path):
    run = tmp_path / "run"
    _synthetic_run(run, ["reward/mean", "train/entropy"])
    page = write_report(run).read_text()
    pngs = sorted(p.name for p in (run / "report").glob("*.png"))
    assert pngs == ["entropy.png", "reward.png"]
    skipped = page.split("Not plotted")[1].split("</ul>")[0]
    for family in FAMILIES:
        assert (html.escape(family.title) in skipped) == (family.slug not in ("reward", "entropy"))
    assert "No eval.json" in page


def test_a_metric_at_zero_every_step_is_not_drawn_and_the_report_says_why(tmp_path):
    """No KL term and one update per batch: kl_ref, approx_kl_old and clip_frac stay 0. They are not drawn as
    flat lines; the page names each with the reason read from the run's config."""
    run = tmp_path / "run"
    _synthetic_run(run, ["reward/mean", "train/entropy"])
    rows = [{**r, "train/kl_ref": 0.0, "train/approx_kl_old": 0.0, "train/clip_frac": 0.0} for r in _metrics(run)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.yaml").write_text("algo:\n  kl: {coef: 0.0}\ntrain:\n  epochs: 1\n  minibatches: 1\n")
    page = write_report(run).read_text()
    assert sorted(p.name for p in (run / "report").glob("*.png")) == ["entropy.png", "reward.png"]
    zero = page.split('<ul class="note zero">')[1].split("</ul>")[0]
    assert "train/kl_ref (KL divergence): no KL term (algo.kl.coef is 0)" in zero
    assert "train/clip_frac (clip fraction): one optimizer step per batch" in zero
    rows[2]["train/clip_frac"] = 0.25  # it moved once: drawn, and no longer listed
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = write_report(run).read_text()
    assert (run / "report" / "clip.png").is_file() and "train/clip_frac (clip" not in page


def test_every_family_plotted_when_every_metric_is_logged(tmp_path):
    run = tmp_path / "run"
    _synthetic_run(run, _all_keys())
    page = write_report(run).read_text()
    assert sorted(p.name for p in (run / "report").glob("*.png")) == sorted(f"{f.slug}.png" for f in FAMILIES)
    assert "Not plotted" not in page and "not logged" not in page


def test_eval_json_of_reinforge_eval_and_custom_out_path(tmp_path):
    run = tmp_path / "run"
    _synthetic_run(run, ["reward/mean"], samples=False)
    result = {"num_prompts": 7, "samples": 2, "greedy_accuracy": 0.25, "mean_at_n": 0.5, "pass_at_k": {"1": 0.5, "2": 0.75},
              "maj_at_k": {"1": 0.5}, "confidence_intervals_95": {"pass@2": [0.125, 0.875]}}
    (run / "eval.json").write_text(json.dumps({"task": "t", "models": {"<m1>": result, "m2": {**result, "greedy_accuracy": 0.5}}}))
    (run / "passk.png").write_bytes(_tiny_png())
    out = write_report(run, tmp_path / "elsewhere" / "page.html")
    page = out.read_text()
    assert out == tmp_path / "elsewhere" / "page.html" and (tmp_path / "elsewhere" / "page" / "passk.png").is_file()
    assert "<th>&lt;m1&gt;</th><th>m2</th>" in page
    assert "0.875" in page and "<th>pass@2</th>" in page and "<th>maj@1</th>" in page
    assert "No samples.jsonl" in page


def test_breakdown_by_task_metadata_is_tabled_per_column(tmp_path):
    run = tmp_path / "run"
    _synthetic_run(run, ["reward/mean"], samples=False)
    before = {"num_prompts": 5, "samples": 4, "greedy_accuracy": 0.4, "mean_at_n": 0.35,
              "breakdown": {"difficulty": {"0": {"prompts": 3, "greedy_accuracy": 0.6667, "mean@4": 0.5},
                                           "<2>": {"prompts": 2, "greedy_accuracy": 0.0, "mean@4": 0.125}}}}
    after = {**before, "breakdown": {"difficulty": {"0": {"prompts": 3, "greedy_accuracy": 1.0, "mean@4": 0.75}}}}
    (run / "eval.json").write_text(json.dumps({"before": before, "after": after}))
    page = write_report(run).read_text()
    table = page.split('<table class="eval breakdown">')[1].split("</table>")[0]
    assert "<th>before</th><th>after</th>" in table
    assert '<tr><th>difficulty = 0 <small>(3 prompts)</small></th><td class="num">0.6667 / 0.5</td><td class="num">1 / 0.75</td></tr>' in table
    assert '<th>difficulty = &lt;2&gt; <small>(2 prompts)</small></th><td class="num">0 / 0.125</td><td>–</td>' in table


def test_no_breakdown_table_without_one(tmp_path):
    run = tmp_path / "run"
    _synthetic_run(run, ["reward/mean"], samples=False)
    (run / "eval.json").write_text(json.dumps({"before": {"greedy_accuracy": 0.4}, "after": {"greedy_accuracy": 0.5}}))
    page = write_report(run).read_text()
    assert "<th>before</th>" in page and "breakdown" not in page.split('<section id="eval">')[1].split("<details>")[0]


def _tiny_png():
    import matplotlib

    matplotlib.use("Agg")
    import io

    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(1, 1))
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def test_not_a_run_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ReinforgeError) as err:
        write_report(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(err.value) and "metrics.jsonl" in str(err.value)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "metrics.jsonl").write_text('{"step": 1}\n{oops\n')
    with pytest.raises(ReinforgeError, match=r"metrics.jsonl:2"):
        write_report(tmp_path / "bad")


# ------------------------------------------------------------------------------- rendered in Chromium
@pytest.fixture(scope="module")
def browser() -> str:
    """Headless Chromium (Debian: chromium); the test is skipped, with the reason, where it is missing."""
    return find_browser("the rendering test needs it")


def _body_after_load(browser: str, page, profile) -> dict[str, str]:
    """The <body> attributes of the page's DOM after load, as headless Chromium renders it."""
    dom = dump_dom(browser, page, profile)
    body = re.search(r"<body([^>]*)>", dom)
    assert body, dom[:2000]
    return dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1)))


def test_chromium_renders_every_plot(browser, real_run, tmp_path):
    page = write_report(real_run)
    n_images = page.read_text().count("<img ")
    assert n_images >= 5
    body = _body_after_load(browser, page, tmp_path / "profile")
    assert body.get("data-images-total") == str(n_images)
    assert body.get("data-images-ok") == str(n_images)
    assert body.get("data-images-loaded") == "true"
    # control: a page with one corrupted image must not pass the same check
    broken = tmp_path / "broken.html"
    text = page.read_text()
    data = IMG.search(text).group(1)
    broken.write_text(text.replace(data, base64.b64encode(b"not a png").decode(), 1))
    body = _body_after_load(browser, broken, tmp_path / "profile2")
    assert body.get("data-images-ok") == str(n_images - 1) and "data-images-loaded" not in body
