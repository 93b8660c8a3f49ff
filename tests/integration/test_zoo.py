"""Every family transformers ships, held to its own eager attention through attnviz's public API.

``zoo.discover()`` finds the families in transformers' auto-model mappings, ``zoo.build`` makes a tiny seeded model of
each (peaked attention), and each family is one test, so xdist spreads them over the workers. Per family, against
``zoo_reference`` (transformers' eager attention, plain hooks, no attnviz code): captured patterns (≤ 1e-5), logits
(≤ 1e-4), statistics, ``patch_heads`` against a forward pre-hook on the output projection, and norm weighting against
α_ij·‖W_O^h v_j‖. A family that cannot be built generically is in ``UNBUILDABLE``; a check that fails today is in
``KNOWN`` with its reason and the issue item that owns it. Anything else that is wrong or crashes fails the test, and
so does a newly discovered family that neither passes nor is listed.

Vision families (``zoo.discover_vision()``: image classifiers on a picture, vision-language models on a prompt with a
picture) are held to eager attention through the same public API: every captured stack's patterns (≤ 1e-5), the
outputs (≤ 1e-4), and statistics over two pictures against the hand computation (those that read no position: an
image model measures positions on its patch grid); a vision-language model's language model also to ``patch_heads``
with the picture against a pre-hook on each output projection, to norm weighting against α·‖W_O^h v_j‖, and
``generate`` to transformers' greedy ``generate`` (the same tokens).
``VISION_UNBUILDABLE`` and ``VISION_KNOWN`` list the rest.

``ZOO_RESULTS=FILE`` appends one JSON line per family with the outcome of every check (``zoo-failures`` tables).
"""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch
import zoo
import zoo_reference as ref
from tiny_vision import sample_images
from zoo_known import KNOWN, UNBUILDABLE, VISION_KNOWN, VISION_UNBUILDABLE

TEXT = "the cat sat on the mat because it was tired"
#: a shorter text batched with TEXT: padded after its tokens (with a sliding window of 4 its last queries see none)
SHORT_TEXT = "the cat sat"
TARGET = "a cat sat down"
CLEAN = "mary and john went out, john gave it to"
CORRUPT = "mary and john went out, mary gave it to"
#: answer and wrong token, the first pair that is one token each in the family's tokenizer (some families read the
#: saved WordPiece files with their own tokenizer class, which splits words into characters)
ANSWERS = ((" mary", " john"), ("m", "j"))
#: a vision-language model's prompt (attnviz puts the picture before it), and two seeded pictures (the first captured)
PROMPT, CORRUPT_PROMPT = "a red cat", "a red mat"
PICTURES = sample_images(2, seed=3, size=40)
PATTERN_TOLERANCE, OUTPUT_TOLERANCE = 1e-5, 1e-4
#: statistics: weights within 1e-5 move a mean distance (up to ~12 tokens) by ~1e-4, an entropy (−Σ a ln a, with
#: ln a down to ~−20 on peaked rows) by ~1e-3: entropy differences are divided by ENTROPY_SPREAD before comparing
STAT_TOLERANCE, ENTROPY_SPREAD = 1e-4, 10.0


@pytest.fixture(scope="session")
def zoo_dirs(tmp_path_factory):
    """``family -> directory``, each model built on first use and kept for the session."""
    root = tmp_path_factory.mktemp("zoo")
    built: dict[str, object] = {}

    def directory(family: str):
        if family not in built:
            make = zoo.build_vision if family in zoo.discover_vision() else zoo.build
            built[family] = make(family, root / family.replace(":", "-"))
        return built[family]

    return directory


def _largest(pairs) -> float:
    """The largest absolute difference over ``(mine, reference)`` tensor pairs (shape mismatch: a ValueError)."""
    worst = 0.0
    for mine, expected in pairs:
        if mine.shape != expected.shape:
            raise ValueError(f"shape {tuple(mine.shape)} where eager has {tuple(expected.shape)}")
        worst = max(worst, float((mine.double() - expected.double()).abs().max()))
    return worst


def _layers_of(capture, stack: str) -> list[torch.Tensor]:
    return [capture.layer(layer, stack) for layer in capture.recorded_layers(stack)]


def _compare_stacks(mine: dict, expected: dict) -> float:
    if not any(expected.values()):
        raise LookupError("eager attention returns no weights for this family (output_attentions gives none)")
    for stack, layers in expected.items():
        if len(mine.get(stack, [])) != len(layers):
            raise ValueError(f"{len(mine.get(stack, []))} {stack} layers where eager has {len(layers)}")
    return _largest(pair for stack, layers in expected.items() for pair in zip(mine[stack], layers))


def _check_statistics(loaded, data: list, expected: dict, stacks=("self", "encoder"), **options) -> float:
    """``compute_statistics`` on ``data`` against a hand computation from eager ``expected`` patterns, ``{stack:
    [[h, q, k] per layer]}`` (one example) or ``[[examples, h, q, k] per layer]`` (one row of equal length each:
    the mean over queries is the mean of each example's means). Image models measure positions on the patch grid:
    only the statistics that read no position are compared for them."""
    import attnviz
    from attnviz.stats.definitions import STATISTIC_INDEX

    stats = attnviz.compute_statistics(loaded, data, progress=False, **options)
    positions = isinstance(data[0], str) and "images" not in options
    pairs = []
    for stack in stacks:
        sites = sorted((s for s in stats.sites if s.stack == stack), key=lambda s: s.layer)
        if stack not in expected:
            continue
        if len(sites) != len(expected[stack]):
            raise ValueError(f"statistics of {len(sites)} {stack} layers where eager has {len(expected[stack])}")
        for site, pattern in zip(sites, expected[stack]):
            examples = pattern if pattern.dim() == 4 else pattern[None]
            hand = [ref.hand_statistics(example, positions) for example in examples]
            for name in hand[0]:
                if hand[0][name] is not None:
                    value = torch.stack([h[name] for h in hand]).mean(0)
                    spread = ENTROPY_SPREAD if name == "entropy" else 1.0
                    pairs.append((stats.sites[site].mean[STATISTIC_INDEX[name]] / spread, value / spread))
    if not pairs:
        raise LookupError(f"no statistics of the stacks {', '.join(stacks)}")
    return _largest(pairs)


def _check_patching(loaded, model, family: str) -> float:
    import attnviz

    encoder_decoder = (
        model.config.is_encoder_decoder
    )  # (BART is in the masked-LM mapping too: it answers in its decoder)
    mask = loaded.tokenizer.mask_token if zoo.is_masked_lm(family) and not encoder_decoder else None
    suffix = f" {mask}" if mask else ""
    tokenizer = loaded.tokenizer
    answer_text, wrong_text = next(
        pair for pair in ANSWERS if all(len(tokenizer(t, add_special_tokens=False)["input_ids"]) == 1 for t in pair)
    )
    result = attnviz.patch_heads(
        loaded, clean=CLEAN + suffix, corrupt=CORRUPT + suffix, answer=answer_text, wrong=wrong_text, batch_size=16
    )
    clean, corrupt = (tokenizer(t + suffix, return_tensors="pt")["input_ids"] for t in (CLEAN, CORRUPT))
    answer, wrong = (tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in (answer_text, wrong_text))
    # an encoder-decoder answers at its first decoder position, after the decoder start token
    extra = {"decoder_input_ids": torch.tensor([[model.config.decoder_start_token_id]])} if encoder_decoder else {}
    where = int((clean[0] == tokenizer.mask_token_id).nonzero()[0]) if mask else -1
    blocks = ref.run_blocks(model, clean, extra)
    heads = model.config.get_text_config().num_attention_heads
    clean_heads, clean_logits = ref.head_inputs(model, clean, blocks, extra)
    _, corrupt_logits = ref.head_inputs(model, corrupt, blocks, extra)
    diff = lambda logits: float(logits[where, answer] - logits[where, wrong])
    pairs = [(result.clean_logit_diff, diff(clean_logits)), (result.corrupt_logit_diff, diff(corrupt_logits))]
    # each output-projection call is one attnviz layer of its block's stack, in call order within the stack
    applications = [(number, sum(n == number for n, _ in clean_heads[:i])) for i, (number, _) in enumerate(clean_heads)]
    stacks = [ref.stack_of(blocks[number][0], encoder_decoder, blocks[number][1]) for number, _ in applications]
    sites = {}
    for stack in dict.fromkeys(stacks):
        mine = sorted({h.layer for h in result.heads if h.stack == stack})
        theirs = [i for i, other in enumerate(stacks) if other == stack]
        if len(mine) != len(theirs):
            raise ValueError(
                f"patched {len(mine)} {stack} layers where the model applies {len(theirs)} attention blocks"
            )
        sites.update({(stack, layer): call for layer, call in zip(mine, theirs)})
    if len(sites) != len({(h.stack, h.layer) for h in result.heads}):
        raise ValueError("patched heads of a stack the model's attention blocks do not have")
    for effect in result.heads:
        call = sites[effect.stack, effect.layer]
        number, application = applications[call]
        values = clean_heads[call][1]
        logits = ref.patched_logits(model, corrupt, blocks[number][1], application, effect.head, heads, values, extra)
        pairs.append((effect.patched_logit_diff, diff(logits)))
    return _largest((torch.tensor(mine), torch.tensor(expected)) for mine, expected in pairs)


def _outcome(check, family: str, results: dict) -> None:
    """Run one check: ``results[name]`` = "exact", "wrong: …", "refused: …" or "crash: …"."""
    import attnviz

    name, run, tolerance = check
    try:
        worst = run()
    except attnviz.AttnvizError as exc:
        message = str(exc)
        results[name] = f"refused: {message}" if "\n" not in message else f"crash: multi-line refusal {message!r}"
        return
    except Exception as exc:  # noqa: BLE001 - every crash is a finding, reported with where it happened
        where = exc.__traceback__
        while where is not None and where.tb_next is not None:
            where = where.tb_next
        frame = f"{where.tb_frame.f_code.co_filename.split('site-packages/')[-1]}:{where.tb_lineno}" if where else ""
        results[name] = f"crash: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''} at {frame}"
        return
    results[name] = "exact" if worst <= tolerance else f"wrong: max diff {worst:.3g}"


def _checks(family: str, directory, model) -> list:
    """``(name, run, tolerance)`` of every check after loading; each run returns its largest difference."""
    import attnviz

    loaded = _load(directory)
    encoder_decoder = model.config.is_encoder_decoder
    target = TARGET if encoder_decoder else None
    batch = loaded.encode([TEXT], targets=None if target is None else [target])
    logits, expected = ref.run_eager(model, dict(batch.inputs))

    def patterns():
        capture = attnviz.capture(loaded, TEXT, target=target)
        return _compare_stacks({s: _layers_of(capture, s) for s in capture.stacks}, expected)

    def outputs():
        with torch.no_grad():
            mine = loaded.forward(batch, logits=True).logits[0]
        return _largest([(mine, logits)])

    def norm():
        capture = attnviz.capture(loaded, TEXT, target=target, weighting="norm")
        model_type = model.config.model_type
        if model_type in ref.VALUE_READERS:  # attention in the family's own eager code: values read by a hook
            reference = ref.eager_code_norm_maps(model, dict(batch.inputs), model_type)
        else:
            reference = ref.norm_maps(model, dict(batch.inputs))
        scale = max(float(m.abs().max()) for maps in reference.values() for m in maps)
        return _compare_stacks({s: _layers_of(capture, s) for s in capture.stacks}, reference) / max(1.0, scale)

    def padded():
        # the outputs of a padded batch at every position, padding included, against eager's on the same inputs
        texts = [TEXT, SHORT_TEXT]
        padded_batch = loaded.encode(texts, targets=None if target is None else [target, target])
        with torch.no_grad():
            mine = loaded.forward(padded_batch, logits=True).logits
            theirs = model(**dict(padded_batch.inputs), use_cache=False).logits
        return _largest([(mine, theirs)])

    return [
        ("patterns", patterns, PATTERN_TOLERANCE),
        ("outputs", outputs, OUTPUT_TOLERANCE),
        ("padded", padded, OUTPUT_TOLERANCE),
        ("statistics", lambda: _check_statistics(loaded, [TEXT], expected), STAT_TOLERANCE),
        ("patching", lambda: _check_patching(loaded, model, family), OUTPUT_TOLERANCE),
        ("norm", norm, PATTERN_TOLERANCE),
    ]


def _load(directory):
    import attnviz

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the eager fallback's notice
        return attnviz.load_model(str(directory), device="cpu")


def _vision_checks(name: str, directory, model) -> list:
    """``(name, run, tolerance)`` of every check of an image classifier or vision-language model after loading:
    patterns of every stack against eager attention (each captured layer against eager's layer of that number),
    outputs, and statistics over two pictures."""
    import attnviz

    loaded = _load(directory)
    prompt = PROMPT if name.startswith("image-text:") else None
    if prompt is not None:
        capture = attnviz.capture(loaded, prompt, image=PICTURES[0])
    else:
        capture = attnviz.capture(loaded, PICTURES[0])
    batch = loaded.encode_images(PICTURES[:1], **({"texts": [prompt]} if prompt else {}))
    with torch.no_grad():
        outputs = model(**batch.inputs, output_attentions=True)
    eager = list(outputs.attentions)
    captured = {(stack, layer) for stack in capture.stacks for layer in capture.recorded_layers(stack)}
    layers = sorted(layer for _, layer in captured)
    attending = [number for number, weights in enumerate(eager) if weights is not None]
    # eager's weights of each captured layer: by layer number, or in order where eager leaves out the layers
    # without attention (a hybrid language model, Qwen3.5)
    eager_index = dict(zip(layers, attending, strict=False)) if len(layers) == len(attending) else {}

    def patterns():
        if layers != attending and len(eager) != len(attending) or not eager_index:
            raise ValueError(f"captured layers {layers} where eager attends in {attending}")
        return _largest(
            (capture.layer(layer, stack), eager[eager_index[layer]][0].float()) for stack, layer in captured
        )

    def outputs_check():
        with torch.no_grad():
            mine = loaded.forward(batch, logits=True)
            if hasattr(mine, "logits"):
                return _largest([(mine.logits, outputs.logits)])
            # attnviz reads the vision tower of a whole image-text checkpoint (CLIP, SigLIP): the tower's output
            tower = model.vision_model(pixel_values=batch.inputs["pixel_values"])
        return _largest([(mine.last_hidden_state, tower.last_hidden_state)])

    def statistics():
        both = loaded.encode_images(PICTURES, **({"texts": [prompt] * 2} if prompt else {}))
        with torch.no_grad():
            attentions = model(**both.inputs, output_attentions=True).attentions
        expected = {s: [attentions[eager_index[n]].float() for n in capture.recorded_layers(s)] for s in capture.stacks}
        if prompt is None:
            return _check_statistics(loaded, PICTURES, expected, stacks=capture.stacks)
        return _check_statistics(loaded, [prompt] * 2, expected, stacks=capture.stacks, images=PICTURES)

    checks = [
        ("patterns", patterns, PATTERN_TOLERANCE),
        ("outputs", outputs_check, OUTPUT_TOLERANCE),
        ("statistics", statistics, STAT_TOLERANCE),
    ]
    if prompt is None:
        return checks
    language = next(getattr(model.model, n) for n in ("language_model", "text_model") if hasattr(model.model, n))

    def norm():
        normed = attnviz.capture(loaded, prompt, image=PICTURES[0], weighting="norm")
        reference = [m for maps in ref.norm_maps(model, dict(batch.inputs), within=language).values() for m in maps]
        mine = [normed.layer(layer, stack) for stack, layer in sorted(captured, key=lambda site: site[1])]
        if len(mine) != len(reference):
            raise ValueError(f"{len(mine)} norm-weighted layers where eager has {len(reference)}")
        return _largest(zip(mine, reference)) / max(1.0, max(float(m.abs().max()) for m in reference))

    def generation():
        written = attnviz.generate(loaded, prompt, image=PICTURES[0], max_new_tokens=3)
        with torch.no_grad():
            expected = model.generate(**batch.inputs, max_new_tokens=3, min_new_tokens=3, do_sample=False)
        expected = expected[0, batch.inputs["input_ids"].shape[1] :].tolist()
        return 0.0 if written.token_ids == expected else float("inf")

    return [
        *checks,
        ("patching", lambda: _check_picture_patching(loaded, model, language), OUTPUT_TOLERANCE),
        ("norm", norm, PATTERN_TOLERANCE),
        ("generation", generation, 0.0),
    ]


def _check_picture_patching(loaded, model, language) -> float:
    """``patch_heads(..., image=)`` against a forward pre-hook on each language-model head's output projection in
    the corrupt run (the picture in both prompts; the answer read at the last position)."""
    import attnviz

    tokenizer = loaded.tokenizer
    answer_text, wrong_text = next(
        pair for pair in ANSWERS if all(len(tokenizer(t, add_special_tokens=False)["input_ids"]) == 1 for t in pair)
    )
    result = attnviz.patch_heads(
        loaded, clean=PROMPT, corrupt=CORRUPT_PROMPT, answer=answer_text, wrong=wrong_text, image=PICTURES[0]
    )
    encoded = [loaded.encode_images(PICTURES[:1], texts=[text]).inputs for text in (PROMPT, CORRUPT_PROMPT)]
    (clean, clean_extra), (corrupt, corrupt_extra) = (
        (inputs["input_ids"], {k: v for k, v in inputs.items() if k != "input_ids"}) for inputs in encoded
    )
    answer, wrong = (tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in (answer_text, wrong_text))
    blocks = ref.run_blocks(model, clean, clean_extra, within=language)
    heads = model.config.get_text_config().num_attention_heads
    clean_heads, clean_logits = ref.head_inputs(model, clean, blocks, clean_extra)
    _, corrupt_logits = ref.head_inputs(model, corrupt, blocks, corrupt_extra)
    diff = lambda logits: float(logits[-1, answer] - logits[-1, wrong])
    pairs = [(result.clean_logit_diff, diff(clean_logits)), (result.corrupt_logit_diff, diff(corrupt_logits))]
    layers = sorted({effect.layer for effect in result.heads})  # the model's layer numbers, every stack
    if len(layers) != len(clean_heads):
        raise ValueError(f"patched {len(layers)} layers where the language model applies {len(clean_heads)} blocks")
    for effect in result.heads:
        number, values = clean_heads[layers.index(effect.layer)]
        logits = ref.patched_logits(model, corrupt, blocks[number][1], 0, effect.head, heads, values, corrupt_extra)
        pairs.append((effect.patched_logit_diff, diff(logits)))
    return _largest((torch.tensor(mine), torch.tensor(expected)) for mine, expected in pairs)


def _run_family(family: str, class_name: str, zoo_dirs, checks, known: dict) -> None:
    """Build, load and check one family; fail on any outcome other than exact that ``known`` does not list."""
    results: dict[str, str] = {}
    state: dict = {}

    def build():
        state["directory"] = zoo_dirs(family)
        state["model"] = ref.eager_model(state["directory"], class_name)
        return 0.0

    _outcome(("build", build, 0.0), family, results)

    def load():
        state["checks"] = checks(family, state["directory"], state["model"])
        return 0.0

    if "model" in state:
        _outcome(("load", load, 0.0), family, results)
    for check in state.get("checks", []):
        _outcome(check, family, results)
    if os.environ.get("ZOO_RESULTS"):
        with open(os.environ["ZOO_RESULTS"], "a") as out:
            out.write(json.dumps({"family": family, **results}) + "\n")
    known = known.get(family, {})
    unexpected = {c: r for c, r in results.items() if r != "exact" and c not in known}
    fixed = [c for c in known if results.get(c) == "exact"]
    if fixed:
        warnings.warn(f"{family}: {', '.join(fixed)} now exact: remove them from KNOWN", stacklevel=1)
    assert not unexpected, f"{family}: " + "; ".join(f"{c}: {r}" for c, r in unexpected.items())


@pytest.mark.parametrize("family", sorted(zoo.discover()))
def test_family_equals_eager_attention(zoo_dirs, family):
    if family in UNBUILDABLE:
        pytest.skip(f"not built generically: {UNBUILDABLE[family]}")
    _run_family(family, zoo.discover()[family], zoo_dirs, _checks, KNOWN)


@pytest.mark.parametrize("name", sorted(zoo.discover_vision()))
def test_vision_family_equals_eager_attention(zoo_dirs, name):
    """An image classifier (``image:vit``) on a picture, a vision-language model (``image-text:llava``) on a prompt
    with a picture."""
    if name in VISION_UNBUILDABLE:
        pytest.skip(f"not built generically: {VISION_UNBUILDABLE[name]}")
    _run_family(name, zoo.discover_vision()[name][1], zoo_dirs, _vision_checks, VISION_KNOWN)


def test_known_lists_name_only_discovered_families_and_checks():
    """A family that transformers no longer ships, or a misspelt check, must leave the lists."""
    for unbuildable, known, families in (
        (UNBUILDABLE, KNOWN, set(zoo.discover())),
        (VISION_UNBUILDABLE, VISION_KNOWN, set(zoo.discover_vision())),
    ):
        assert set(unbuildable) <= families and set(known) <= families
        assert not set(unbuildable) & set(known)
        checks = {"build", "load", "patterns", "outputs", "statistics", "patching", "norm", "generation"}
        assert all(set(entry) <= checks and entry for entry in known.values())
