"""`GradientMonitor`: a Keras callback that logs the gradients ``model.fit`` really applies.

```python
from tensorboard_gradients.keras import GradientMonitor

model.fit(x, y, epochs=5, callbacks=[GradientMonitor("logs")])
# tensorboard --logdir logs   ->  Gradients tab, run "train"
```

Keras 3 on any of its TensorFlow, JAX and PyTorch backends (``KERAS_BACKEND``; one recorder
per backend hooks the optimizer INSTANCE for the duration of ``fit``):

* TensorFlow (`keras_recorder`): wraps ``optimizer.apply``; a ring buffer of device variables
  inside the traced (XLA) step, read every few recorded steps; ``tf.distribute`` strategies;
* JAX (`keras_jax`): wraps ``optimizer.stateless_apply``; inside the jitted step a ``lax.cond``
  computes the statistics at logged steps only and an ``io_callback`` hands the host the small
  matrix; ``keras.distribution`` (global arrays reduced where they lie);
* PyTorch (`keras_torch`): wraps ``optimizer.apply``; the matrices stay on the gradients'
  device until read; ``jit_compile=True`` (``torch.compile``) runs the recorder outside the
  compiled graph.

No second forward/backward pass: the statistics of the gradients handed to the optimizer are
computed on the device inside the train step, and only the small ``[variables, stats]`` matrix
crosses to the host, every ``every_n_steps`` steps. Works with ``jit_compile=True``,
``steps_per_execution > 1`` (TensorFlow and JAX; Keras' torch backend allows only 1), mixed
precision and optimizer clipping. Backend differences: a variable the loss does not use has a
missing gradient on TensorFlow and PyTorch but zeros on JAX (``jax.grad``'s, which Keras
applies); ``update_l2_norm`` is recorded on every backend except TensorFlow with several
replicas.

Steps are 1-based optimizer steps counted across epochs and ``fit`` calls (step k = the k-th
update; a step that ``LossScaleOptimizer`` skipped still counts, so it stays visible). The first
``fit`` starts from ``optimizer.iterations``, so a restored model continues its numbering. In a
model's first ``fit`` with ``steps_per_execution=1`` they are the steps
``keras.callbacks.TensorBoard(update_freq="batch")`` logs ``batch_loss`` at (it counts each
``fit`` from 1, one step per execution), on every backend.

Besides the ``<name>`` statistics (and ``<name>_histograms``), the monitor writes to
``log_dir/train``:

* ``<name>_epochs``: the step at which each epoch starts (the UI marks epochs with it);
* ``<name>_loss``: the loss of the batches at each logged step that ends a call of
  ``on_train_batch_end`` (each batch; with ``steps_per_execution=k``, each k-th, the mean of
  the k), for the loss-spike rule. Keras reports the mean over the epoch so far
  (``logs["loss"]``); the monitor takes the batches' own mean back out of it (``n m_n - p m_p``
  over ``n - p`` batches, ``m`` the epoch's running means), so a spike is not averaged away nor
  an epoch's start mistaken for one. Exact for batches of equal size (the epoch's last, smaller
  batch is weighted as a full one);
* ordinary scalars ``<name>/global_norm`` (all trainable variables, before clipping),
  ``<name>/global_norm_clipped`` (after the optimizer's clipping rule, when it clips),
  ``<name>/loss_scale`` and ``<name>/skipped_step`` (1 where mixed precision skipped the update);
* with ``probe_data``: ``<name>_probe``, the gradients on that fixed batch once per epoch.

The train step is traced with the hooks once per model and compile: the hooks are installed
at the start of each ``fit`` and removed at its end, and the monitor keeps the traced step it
made and hands it back to the next ``fit`` of the same model (calling ``fit`` once per epoch, a
tuner's or fine-tuning phases' ``fit`` calls cost no retrace), while a ``fit`` without the
monitor traces and runs a clean step of its own. ``compile`` again, another optimizer or other
trainable variables make the next ``fit`` trace anew, as Keras itself does.
"""

import logging
import os

import keras
import numpy as np

from tensorboard_gradients.capture import options
from tensorboard_gradients.capture.keras_hooks import RECORDED_STEPS_PER_READ, Patches
from tensorboard_gradients.format import columns, metadata, storage
from tensorboard_gradients.format.layout import Layout, MissingGradientWarnings
from tensorboard_gradients.format.writer import GradientWriter

logger = logging.getLogger(__name__)

__all__ = ["GradientMonitor"]

PROBE_SUFFIX = "_probe"
BACKENDS = ("tensorflow", "jax", "torch")


def _backend_module():
    """The recorder of this process' Keras backend (imported on first use: each imports its
    framework)."""
    backend = keras.backend.backend()
    if backend == "jax":
        from tensorboard_gradients.capture import keras_jax as module
    elif backend == "torch":
        from tensorboard_gradients.capture import keras_torch as module
    else:
        from tensorboard_gradients.capture import keras_recorder as module
    return module


def _probe_module():
    """What measures ``probe_data`` on this backend: ``probe_function`` and ``run_probe``."""
    if keras.backend.backend() == "tensorflow":
        from tensorboard_gradients.capture import keras_probe

        return keras_probe
    return _backend_module()


def _probe_batch(probe_data):
    if probe_data is None:
        return None
    if not isinstance(probe_data, (tuple, list)) or len(probe_data) not in (2, 3):
        raise ValueError(
            "probe_data must be a tuple (x, y) or (x, y, sample_weight) of one fixed batch, got "
            f"{type(probe_data).__name__}"
        )
    return tuple(probe_data) + (None,) * (3 - len(probe_data))


def _make_hooked_train_function(model):
    """``model.make_train_function(force=True)`` through a ``train_step`` of its own.

    JAX's ``jit`` caches traces by function while the function lives: were the monitored step
    traced from ``model.train_step`` itself, the step this monitor keeps would answer for every
    later ``jit(model.train_step)`` (a fit without the monitor would run the hooks; another
    monitor's fit would feed this one).
    """
    patches = Patches()
    step = model.train_step
    patches.apply(model, "train_step", lambda *args, **kwargs: step(*args, **kwargs))
    try:
        model.make_train_function(force=True)
    finally:
        patches.undo()


def _iterations(model):
    return int(np.asarray(model.optimizer.iterations))


def _recorded_between(done_before, done_after, every):
    """How many of the steps with 0-based indices [done_before, done_after) are recorded."""
    return (done_after + every - 1) // every - (done_before + every - 1) // every


def variable_paths(model):
    """Names for ``model.trainable_variables`` that show where each variable sits in the model.

    Keras 3 ``var.path`` depends on where a layer was built: a sub-model built on its own keeps
    ``inner/dense/kernel`` while the outer model's layers may carry the outer model's name. Here
    every name starts at the outer model's top-level layer (``inner/dense/kernel``,
    ``head/kernel``), so all layers of one model read alike.
    """
    root = model.name + "/"
    paths = {}
    for layer in model.layers:
        for variable in layer.trainable_variables:
            path = variable.path[len(root):] if variable.path.startswith(root) else variable.path
            if not (path == layer.name or path.startswith(layer.name + "/")):
                path = f"{layer.name}/{path}"
            paths.setdefault(id(variable), path)
    return [paths.get(id(v), v.path) for v in model.trainable_variables]


class GradientMonitor(keras.callbacks.Callback):
    """Logs per-variable statistics of the gradients ``model.fit`` applies (Keras 3: TensorFlow,
    JAX or PyTorch backend).

    Args:
      log_dir: the same directory you give ``keras.callbacks.TensorBoard(log_dir=...)``, or a
        bucket's fsspec URL (``s3://bucket/logs``); the gradients go to ``log_dir/train``, the
        run of that callback's training scalars.
      every_n_steps: log every N-th optimizer step (steps 1, N+1, 2N+1, ...). Steps between are
        not computed at all.
      histograms_every_n_steps: also log the log10|g| histograms every N-th step (None: never).
        Histograms cost more than the statistics; see ``benchmarks/RESULTS.md``.
      stats_every_n_steps: log every statistic at every N-th logged step (the first, then every
        N-th), and at the logged steps between only the norms and NaN/Inf counts
        (`columns.every_step_stats`: what the spike, exploding, vanishing, NaN and
        early-warning rules judge every step; the weight norm with the update only). 1: every
        statistic at every logged step.
      name: summary name = tag (``gradients``); use different names for several monitors.
      include: regex or list of regexes; only trainable variables whose path (as shown in
        TensorBoard, e.g. ``dense_3/kernel``, or Keras ``var.path``) matches one are logged.
      exclude: regex or list of regexes; matching variables are not logged.
      probe_data: optional ``(x, y)`` or ``(x, y, sample_weight)`` batch: once per epoch, ALSO
        log the gradients of the compiled loss on it (``training=True``, ``model.compute_loss``)
        under ``<name>_probe``, at the epoch's last step. Layer states (BatchNorm statistics,
        dropout seeds; on PyTorch also torch's global random state) are restored afterwards, or
        never changed (JAX's stateless loss), so the probe does not change training.
      strict: raise when the event files cannot be written (a full disk, no permission). By
        default training goes on: the step is dropped, counted (``dropped_steps``) and
        reported, and later steps try again (see `tensorboard_gradients.format.writer`).
      stats: the statistics to log (`columns.selected_stats`): None for all, or some of their
        names; ``("l2_norm",)`` is the cheapest (three passes over each gradient instead of six,
        none over the weights). l2_norm, min, max, abs_max, nan_count, inf_count and size are
        always logged; weight_l2_norm and update_l2_norm only when named. The once-per-epoch
        ``probe_data`` gradients log all.
      on_alert: called with each new `tensorboard_gradients.analysis.Alert` during ``fit``, on
        the training thread, once the steps that raise it are logged and judged (see `alerts`):
        a callback can act on it (``self.model.stop_training = True``, lower the rate, save).

    Raises:
      ValueError: bad arguments; in ``set_model``, a Keras backend other than TensorFlow, JAX
        or PyTorch, or a model that is not a Keras 3 model (e.g. legacy tf-keras).
    """

    def __init__(
        self,
        log_dir,
        every_n_steps=1,
        histograms_every_n_steps=100,
        name=metadata.DEFAULT_NAME,
        include=None,
        exclude=None,
        probe_data=None,
        strict=False,
        stats=None,
        on_alert=None,
        stats_every_n_steps=10,
    ):
        super().__init__()
        self._stats = columns.selected_stats(stats)
        self.name = options.non_empty_name(name)
        self.log_dir = os.fspath(log_dir)
        self.every_n_steps = options.positive_int("every_n_steps", every_n_steps)
        self.histograms_every_n_steps = options.optional_positive_int(
            "histograms_every_n_steps", histograms_every_n_steps)
        self.stats_every_n_steps = options.stats_every(stats_every_n_steps)
        self._include = options.patterns("include", include)
        self._exclude = options.patterns("exclude", exclude)
        self._probe = _probe_batch(probe_data)
        train_dir = storage.join(self.log_dir, "train")  # a directory, or a bucket's URL
        self._writer = GradientWriter(train_dir, name, strict=strict, on_alert=on_alert)
        self._probe_writer = GradientWriter(train_dir, name + PROBE_SUFFIX, strict=strict)
        self._missing = MissingGradientWarnings(logger)
        self._recorder = None
        self._recorder_key = None
        self._traced_train_function = None  # the model's step traced with the hooks
        self._iterations_at_end = None  # optimizer.iterations when the last fit ended
        self._layout = None
        self._probe_function = None
        self._host_completed = 0  # optimizer steps done, as far as the host can tell
        self._host_read_at = 0  # the step count at the last read of the device buffers
        self._batch_begin = 0
        self._last_stats_step = 0
        self._last_histogram_step = 0
        self._losses = {}  # step -> the batches' loss, until the step's statistics are written
        self._epoch_mean = (0, 0.0)  # (batches of this epoch so far, Keras' mean loss over them)

    @property
    def dropped_steps(self):
        """Logged steps that could not be written (see ``strict``)."""
        return self._writer.dropped_steps

    def alerts(self, wait: bool = False):
        """The alerts judged since the last call (`tensorboard_gradients.analysis.Alert`, with
        the ``raised_step`` the analysis fed step by step raised each at), judged in the
        background as steps are written: see `GradientWriter.alerts`. After ``fit``: all."""
        return self._writer.alerts(wait=wait)

    def set_model(self, model):
        backend = keras.backend.backend()
        if backend not in BACKENDS:
            raise ValueError(
                f"GradientMonitor needs the Keras TensorFlow, JAX or PyTorch backend; this Keras "
                f"runs {backend!r}. Log from your own training loop with "
                "tensorboard_gradients.GradientWriter."
            )
        if not isinstance(model, keras.Model):
            raise ValueError(
                "GradientMonitor needs a Keras 3 model (`import keras`); got "
                f"{type(model).__module__}.{type(model).__name__}. Legacy tf-keras (Keras 2) "
                "models are not supported."
            )
        super().set_model(model)

    # --- fit lifecycle ------------------------------------------------------------------------

    def on_train_begin(self, logs=None):
        recorders = _backend_module()
        model = self.model
        if model.optimizer is None:
            raise ValueError("GradientMonitor: compile the model (with an optimizer) before fit")
        watched, names = self._watched_variables(model)
        # `compile` makes a new `_compile_config` (and resets `train_function`): a new loss or
        # jit setting needs a new trace.
        key = (id(model), id(model.optimizer), tuple(id(v) for v in watched),
               int(model.steps_per_execution), id(getattr(model, "_compile_config", None)))
        if key != self._recorder_key:
            self._traced_train_function = None
            first_index = (
                self._recorder.completed_steps()
                if self._recorder is not None
                else _iterations(model)
            )
            self._recorder = recorders.StepRecorder(
                model,
                watched,
                self.every_n_steps,
                self.histograms_every_n_steps,
                steps_between_reads=int(model.steps_per_execution),
                first_step_index=first_index,
                stats=self._stats,
                stats_every_n_steps=self.stats_every_n_steps,
            )
            self._recorder_key = key
            self._layout = Layout.create(
                names,
                [v.shape for v in watched],
                with_weights=self._recorder.logs_weights,
                with_updates=self._recorder.records_updates,
                gradient_stats=self._recorder.gradient_stats,
                with_optimizer=self._recorder.records_adam,
                stats_every=self.stats_every_n_steps,
            )
            if self._recorder.distributed and {"update_l2_norm", "adam_rms"} & set(self._stats):
                logger.info(
                    "GradientMonitor: update_l2_norm and adam_rms are not recorded with %d "
                    "replicas (updates run per device)",
                    model.distribute_strategy.num_replicas_in_sync,
                )
            self._probe_function = None
        elif self._iterations_at_end is not None:
            self._recorder.skip(max(0, _iterations(model) - self._iterations_at_end))
        self._recorder.install(model.trainable_variables)
        if self._traced_train_function is not None:
            # Replaces the step fit just made (untraced) or a clean one a fit without the
            # monitor traced: same model, optimizer, variables and compile, so no retrace.
            model.train_function = self._traced_train_function
        else:
            _make_hooked_train_function(model)
        self._host_completed = self._host_read_at = self._recorder.completed_steps()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_mean = (0, 0.0)
        self._writer.write_epoch(self._host_completed + 1, epoch)

    def on_train_batch_begin(self, batch, logs=None):
        self._batch_begin = batch

    def on_train_batch_end(self, batch, logs=None):
        self._host_completed += batch - self._batch_begin + 1
        if logs and logs.get("loss") is not None:
            (before, mean_before), batches = self._epoch_mean, batch + 1
            mean = float(logs["loss"])
            if batches > before:
                self._losses[self._host_completed] = (
                    (batches * mean - before * mean_before) / (batches - before))
            self._epoch_mean = (batches, mean)
        if any(
            every and _recorded_between(self._host_read_at, self._host_completed, every)
            >= RECORDED_STEPS_PER_READ
            for every in (self.every_n_steps, self.histograms_every_n_steps)
        ):
            self._drain()

    def on_epoch_end(self, epoch, logs=None):
        self._drain()
        if self._probe is not None:
            self._write_probe()

    def on_train_end(self, logs=None):
        try:
            self._drain()
        finally:
            self._recorder.uninstall()
            # The traced step still calls the hooks: kept for this monitor's next fit, while a
            # fit without it traces a clean one.
            self._traced_train_function = self.model.train_function
            self.model.train_function = None
            self._iterations_at_end = _iterations(self.model)
            self._writer.close()
            self._probe_writer.close()

    # --- helpers ------------------------------------------------------------------------------

    def _watched_variables(self, model):
        watched, names = [], []
        for variable, name in zip(model.trainable_variables, variable_paths(model)):
            if not options.selected((name, variable.path), self._include, self._exclude):
                continue
            watched.append(variable)
            names.append(name)
        if not watched:
            raise ValueError(
                "GradientMonitor: no trainable variable to log"
                + (
                    f" (include={[p.pattern for p in self._include or []]}, "
                    f"exclude={[p.pattern for p in self._exclude or []]} matched none of "
                    f"{variable_paths(model)[:10]})"
                    if model.trainable_variables
                    else " (the model has no trainable variables)"
                )
            )
        return watched, names

    def _drain(self):
        """Writes every step the device buffer holds that has not been written yet."""
        completed, rows, histogram_rows = self._recorder.read()
        self._host_completed = self._host_read_at = completed
        size_column = columns.position(self._layout.stats, "size")
        for step, stats, scalars in sorted(rows, key=lambda row: row[0]):
            if step <= self._last_stats_step:
                continue
            self._writer.write_statistics(step, self._layout, stats, loss=self._losses.get(step),
                                          scalars=scalars)
            self._missing.warn(
                [v for v, size in zip(self._layout.variables, stats[:, size_column]) if np.isnan(size)]
            )
            self._last_stats_step = step
        self._losses = {step: loss for step, loss in self._losses.items()
                        if step > self._last_stats_step}
        for step, counts in sorted(histogram_rows, key=lambda row: row[0]):
            if step <= self._last_histogram_step:
                continue
            self._writer.write_histograms(step, self._layout, counts)
            self._last_histogram_step = step

    def _write_probe(self):
        probes = _probe_module()
        if self._probe_function is None:
            self._probe_function = probes.probe_function(
                self.model, self._recorder.watched, histograms=bool(self.histograms_every_n_steps)
            )
        stats, counts = probes.run_probe(self.model, self._probe_function, self._probe)
        layout = Layout.create(
            self._layout.variables, self._layout.shapes, with_weights=True
        )
        self._probe_writer.write_statistics(max(self._host_completed, 1), layout, stats, counts)
