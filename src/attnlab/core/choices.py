"""The values a config may choose for a model's or data's kind-of-thing keys (``norm.placement: pre``, ``model.cell:
gru``, ...): defined here, without torch, so that ``train.py`` checks a command line before torch is imported (a
refused run answers in about a second) and the modules that implement each kind take their list from here."""

PLACEMENTS = ("pre", "post")  # norm.placement (modules/parts.py)
BALANCE = ("layer", "pooled")  # moe.balance: the load-balancing loss per layer, summed (Switch), or over all layers
RNN_ATTENTION_KINDS = ("bahdanau", "luong_dot", "luong_general")  # modules/rnn_attention.py
RNN_CELLS = ("gru", "lstm")  # model.cell (models/seq2seq_rnn.py)
RNN_ATTENTIONS = ("none", *RNN_ATTENTION_KINDS)  # model.attention of the RNN seq2seq
ENCODERS = ("rnn", "cnn", "attention")  # model.encoder of the sequence classifier
SCHEDULES = ("none", "constant", "linear", "exponential", "inverse_sigmoid")  # model.scheduled_sampling.schedule
TARGET_LANGS = ("fr", "de")  # data.target_lang of data=numbers
PROGRESS_STYLES = ("auto", "bar", "lines")  # callbacks.rich_progress_bar.style (callbacks/progress.py)
