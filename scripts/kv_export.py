"""The decoder's KV-cache I/O in the Optimum / transformers.js layout, shared by the model builders:
past_key_values.N.key|value in, present.N.key|value out, KV [batch, kv_heads, seq, head_dim]."""


def decoder_io(num_layers):
    """(past input names, present output names, dynamic axes of every input and output)."""
    past = [f"past_key_values.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    present = [f"present.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    axes = {"input_ids": {0: "batch_size", 1: "sequence_length"},
            "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
            "position_ids": {0: "batch_size", 1: "sequence_length"},
            "logits": {0: "batch_size", 1: "sequence_length"}}
    for n in past:
        axes[n] = {0: "batch_size", 2: "past_sequence_length"}
    for n in present:
        axes[n] = {0: "batch_size", 2: "total_sequence_length"}
    return past, present, axes
