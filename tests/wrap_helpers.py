"""A user's own transformers model, as the tests of ``attnviz.wrap`` load and run it themselves."""

from __future__ import annotations

import torch
import transformers


def user_model(directory, dtype=torch.float32, implementation="sdpa"):
    """The model as a user loads it: transformers' own class, its default attention, in train mode."""
    config = transformers.AutoConfig.from_pretrained(directory)
    model_class = getattr(transformers, config.architectures[0])
    model = model_class.from_pretrained(directory, dtype=dtype, attn_implementation=implementation)
    model.train()
    return model, transformers.AutoTokenizer.from_pretrained(directory)


def inputs_of(tokenizer, text, target=None):
    encoded = tokenizer([text], return_tensors="pt", return_token_type_ids=False)
    inputs = dict(encoded)
    if target is not None:
        inputs["decoder_input_ids"] = tokenizer([target], return_tensors="pt")["input_ids"]
    return inputs


def plain_outputs(model, inputs) -> torch.Tensor:
    """The model's first output in eval mode, training flags put back (the user's own forward pass)."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    with torch.no_grad():
        output = model(**inputs)[0]
    for module, flag in flags:
        module.training = flag
    return output


def eager_patterns(model, inputs) -> dict[str, tuple[torch.Tensor, ...]]:
    """The model's own eager attention weights, by attnviz stack name (its implementation put back)."""
    own = model.config._attn_implementation
    model.set_attn_implementation("eager")
    model.eval()
    with torch.no_grad():
        output = model(**inputs, output_attentions=True)
    model.set_attn_implementation(own)
    if model.config.is_encoder_decoder:
        return {
            "encoder": output.encoder_attentions,
            "decoder": output.decoder_attentions,
            "cross": output.cross_attentions,
        }
    return {"self": output.attentions}
