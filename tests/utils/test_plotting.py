import matplotlib.image as mpimg
import numpy as np
import torch
from matplotlib.figure import Figure

from attnlab.plots.figures import attention_heatmap_figure, figure_to_array, save_figure


def _weights(h=3, tq=5, tk=6):
    return torch.rand(h, tq, tk).softmax(-1)


def test_one_panel_per_head_labels_and_colorbar():
    xl = [f"k{i}" for i in range(6)]
    yl = [f"q{i}" for i in range(5)]
    fig = attention_heatmap_figure(_weights(), x_labels=xl, y_labels=yl, title="layer 0")
    assert isinstance(fig, Figure)
    image_axes = [ax for ax in fig.axes if ax.images]
    assert len(image_axes) >= 3  # 3 heads (+ the colorbar's axes)
    heads = [ax for ax in image_axes if ax.get_title().startswith("head")]
    assert len(heads) == 3
    assert [t.get_text() for t in heads[0].get_xticklabels()] == xl
    assert [t.get_text() for t in heads[0].get_yticklabels()] == yl
    assert len(fig.axes) > len(heads)  # a colorbar axes exists
    assert fig._suptitle is not None and "layer 0" in fig._suptitle.get_text()


def test_max_heads_and_long_sequences_skip_labels():
    w = torch.rand(10, 70, 70)
    fig = attention_heatmap_figure(w, x_labels=[str(i) for i in range(70)], y_labels=[str(i) for i in range(70)],
                                   max_heads=4)
    heads = [ax for ax in fig.axes if ax.get_title().startswith("head")]
    assert len(heads) == 4
    assert all(t.get_text() not in {"68", "69"} for t in heads[0].get_xticklabels())
    assert "first 4 of 10" in fig._suptitle.get_text()


def test_accepts_numpy_2d_and_bf16():
    fig = attention_heatmap_figure(np.eye(4, dtype=np.float64))
    assert len([ax for ax in fig.axes if ax.get_title() == "head 0"]) == 1
    fig = attention_heatmap_figure(_weights().to(torch.bfloat16))
    assert len([ax for ax in fig.axes if ax.get_title().startswith("head")]) == 3


def test_save_figure_png_readable(tmp_path):
    fig = attention_heatmap_figure(_weights(2, 4, 4), x_labels=list("abcd"), y_labels=list("abcd"))
    path = save_figure(fig, tmp_path / "nested" / "dir" / "map.png")
    assert path.exists() and path.suffix == ".png"
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 50 and img.shape[1] > 50


def test_figure_to_array_shape():
    fig = attention_heatmap_figure(_weights(2, 4, 4))
    arr = figure_to_array(fig)
    w, h = fig.canvas.get_width_height()
    assert arr.shape == (h, w, 3) and arr.dtype == np.uint8
    assert arr.min() < arr.max()  # something was drawn
