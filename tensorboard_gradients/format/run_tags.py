"""The stats tags that earlier writers left in a run directory, for `GradientWriter` joining a run
(a restarted job, a second process): it must not write another variable set under a tag that
already has one, or the loaders would show its rows under the first writer's names."""

from tensorboard_gradients.format import event_files, metadata, segment_index, storage


def tags_in_run(logdir, name):
    """``[(tag, layout)]`` of the stats tags of summary ``name`` that earlier writers left in
    the run directory ``logdir``: what TensorBoard shows for each, i.e. the first metadata of
    the tag in the files read in name order, as its loaders do. A writer that joins a run (a
    restarted job, a second process) must not write another variable set under a tag that
    already has one: the loaders would show its rows under the first writer's names.

    Only records carrying our metadata are parsed; unreadable files are passed over (reading
    them is the reader's business, and they cannot hold a tag the loaders show either). In a
    bucket (`storage`) the segments a writer indexed are read from their indexes, which keep
    every record carrying metadata (`segment_index`), at the writer's first write: a job
    restarted on a long run downloads kilobytes per segment, not the run; other objects are
    downloaded whole.
    """
    remote = storage.is_url(logdir)
    try:
        listed, _ = storage.event_listing(
            logdir, segment_index.listed_in_bucket if remote else event_files.is_event_file)
    except OSError:
        return []  # a bucket that does not answer: its uploads will say so
    indexed = segment_index.in_listing(listed) if remote else {}
    found = {}
    for file_name, path, state in listed:  # none when there is no directory yet
        if segment_index.is_index_name(file_name):
            continue
        index = indexed.get(path)
        if index is not None and index.size == state.size:
            for entry in index.entries:  # every record with metadata, in the segment's order
                try:
                    data, _ = entry.compacted()
                except ValueError:  # a crafted index: the segment then holds no tag for us
                    break
                if b"format_version" in data:
                    _note_stats_tags(data, name, found)
            continue
        try:
            with event_files.open_regular_file(path) as file:
                records = event_files.iter_records(file, 0, storage.file_size(file),
                                                   event_files.ReadDamage())
                for record in records:
                    if record.intact and b"format_version" in record.data:
                        _note_stats_tags(record.data, name, found)
        except OSError:
            continue
    return list(found.items())


def _note_stats_tags(record, name, found):
    """Adds the stats tags of summary ``name`` in one event record to ``found`` (first wins)."""
    event = event_files.parse_event(record)
    if event is None:  # a record that does not parse describes no tag
        return
    for value in event.summary.value:
        if value.tag in found or value.metadata.plugin_data.plugin_name != metadata.PLUGIN_NAME:
            continue
        try:
            parsed = metadata.parse_plugin_data(value.metadata.plugin_data.content)
        except metadata.UnsupportedFormatError:
            continue
        if parsed.kind == metadata.KIND_STATS and parsed.name == name:
            found[value.tag] = parsed.layout
