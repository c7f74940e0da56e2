from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from vlm_rewards.data.build import build_preference_dataset, build_progress_dataset
from vlm_rewards.data.episodes import (
    EpisodeDataset,
    EpisodeRecord,
    EpisodeUnion,
    PairDataset,
    PreferencePair,
    write_episodes,
    write_pairs,
)
from vlm_rewards.data.synthetic import ShapesWorld
from vlm_rewards.interface import SampleKey
from vlm_rewards.io import atomic_path


def make_records(num_episodes: int = 3, num_frames: int = 6, with_view: bool = True) -> list[EpisodeRecord]:
    rng = np.random.default_rng(0)
    world = ShapesWorld(size=32)
    records = []
    for episode_id, policy in zip(range(num_episodes), ["expert", "random", "wrong_goal"] * num_episodes):
        episode = world.rollout(rng, num_frames, policy)
        views = {"wrist": np.ascontiguousarray(episode.frames[:, ::-1])} if with_view else {}
        records.append(
            EpisodeRecord(
                episode_id=10 + episode_id,
                instruction=episode.instruction,
                frames=episode.frames,
                progress=episode.progress,
                success=episode.success,
                policy=episode.policy,
                views=views,
                reference=episode.goal_frame,
            )
        )
    return records


def temporary_files(root: Path) -> list[Path]:
    return [path for path in root.rglob("*") if path.name.endswith(".tmp")]


@pytest.mark.parametrize("frame_format, max_pixel_error", [("npz", 0.0), ("mp4", 4.0)])
def test_episode_round_trip(tmp_path, frame_format, max_pixel_error):
    records = make_records()
    dataset = write_episodes(tmp_path / "ds", records, frame_format, fps=5)

    assert len(dataset) == 3
    assert dataset.episode_ids == [10, 11, 12]
    assert dataset.meta["frame_size"] == [32, 32] and dataset.meta["num_frames"] == 18
    assert dataset.meta["fps"] == 5 and dataset.meta["clips"] == ["frames", "view.wrist", "reference"]
    for original, loaded in zip(records, dataset):
        assert loaded.episode_id == original.episode_id
        assert loaded.instruction == original.instruction
        assert loaded.success == original.success and loaded.policy == original.policy
        np.testing.assert_array_equal(loaded.progress, original.progress)
        assert loaded.frames.dtype == np.uint8 and loaded.frames.shape == original.frames.shape
        for name, clip in [("frames", loaded.frames), ("wrist", loaded.views["wrist"])]:
            reference = original.frames if name == "frames" else original.views["wrist"]
            assert np.abs(clip.astype(np.int16) - reference).mean() <= max_pixel_error, name
        np.testing.assert_array_equal(loaded.reference, original.reference)  # lossless in both formats
    assert temporary_files(tmp_path) == []


def test_episode_table_columns_and_dtypes(tmp_path):
    write_episodes(tmp_path, make_records(with_view=False))
    table = pq.read_table(tmp_path / "episodes.parquet")
    assert {field.name: str(field.type) for field in table.schema} == {
        "episode_id": "int64",
        "frame_index": "int32",
        "instruction": "string",
        "progress": "float",
        "success": "bool",
        "policy": "string",
        "stage": "int32",
        "frame_success": "bool",
        "goal_offset_x": "float",
        "goal_offset_y": "float",
    }
    assert sorted(path.name for path in (tmp_path / "frames").iterdir()) == [
        "episode_000010.npz",
        "episode_000011.npz",
        "episode_000012.npz",
    ]


def test_to_request_keys_by_last_frame(tmp_path):
    dataset = write_episodes(tmp_path / "demo", make_records())
    record = dataset[11]
    request = dataset.to_request(record, frame_indices=[0, 2, 4])
    assert request.key == SampleKey(source="demo", episode=11, frame=4)
    np.testing.assert_array_equal(request.frames, record.frames[[0, 2, 4]])
    assert request.views["wrist"].shape[0] == 3 and request.text == record.instruction
    assert request.reference.shape == (1, 32, 32, 3)
    assert dataset.to_request(record).key.frame == record.num_frames - 1
    with pytest.raises(ValueError, match="frame_indices"):
        dataset.to_request(record, frame_indices=[0, 99])


def test_union_reads_several_folders_as_one(tmp_path):
    first = write_episodes(tmp_path / "round1", make_records(num_episodes=3))
    second_records = make_records(num_episodes=2)
    write_episodes(tmp_path / "round2", second_records)
    union = EpisodeUnion([tmp_path / "round1", tmp_path / "round2"])

    assert len(union) == 5 and union.episode_ids == [0, 1, 2, 3, 4]
    assert union.name == "round1+round2"
    assert union.instructions == sorted({*first.instructions, *(r.instruction for r in second_records)})
    record = union[3]  # the second folder's first episode (id 10 there)
    assert record.episode_id == 3 and record.policy == second_records[0].policy
    np.testing.assert_array_equal(record.frames, second_records[0].frames)
    assert union.to_request(record, [0, 1]).key == SampleKey(source="round1+round2", episode=3, frame=1)
    assert [r.episode_id for r in union] == union.episode_ids
    with pytest.raises(KeyError, match="no episode 5"):
        union[5]
    with pytest.raises(ValueError, match="at least one"):
        EpisodeUnion([])


def test_writing_twice_into_one_folder_is_refused(tmp_path):
    write_episodes(tmp_path, make_records(1))
    with pytest.raises(FileExistsError, match="episodes.parquet"):
        write_episodes(tmp_path, make_records(1))


def test_record_validation():
    record = make_records(1)[0]
    with pytest.raises(ValueError, match=r"progress has shape \(5,\)"):
        EpisodeRecord(1, "task", record.frames, record.progress[:5], True)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        EpisodeRecord(1, "task", record.frames, record.progress + 2, True)
    with pytest.raises(ValueError, match="uint8"):
        EpisodeRecord(1, "task", record.frames.astype(np.float32), record.progress, True)


def test_atomic_path_cleans_up_on_failure(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(RuntimeError), atomic_path(target) as temporary:
        temporary.write_bytes(b"half")
        raise RuntimeError("writer crashed")
    assert not target.exists() and list(tmp_path.iterdir()) == []


def test_missing_column_is_named(tmp_path):
    write_episodes(tmp_path, make_records(1))
    table = pq.read_table(tmp_path / "episodes.parquet")
    pq.write_table(table.drop_columns(["progress"]), tmp_path / "episodes.parquet")
    with pytest.raises(ValueError, match=r"episodes.parquet: missing column\(s\) \['progress'\]"):
        EpisodeDataset(tmp_path)


def test_wrong_column_type_is_named(tmp_path):
    write_episodes(tmp_path, make_records(1))
    table = pq.read_table(tmp_path / "episodes.parquet")
    progress64 = table["progress"].cast("float64")
    pq.write_table(table.set_column(3, "progress", progress64), tmp_path / "episodes.parquet")
    with pytest.raises(ValueError, match="column 'progress' has type double, expected float"):
        EpisodeDataset(tmp_path)


def test_optional_policy_column_may_be_absent(tmp_path):
    write_episodes(tmp_path, make_records(1))
    table = pq.read_table(tmp_path / "episodes.parquet")
    pq.write_table(table.drop_columns(["policy"]), tmp_path / "episodes.parquet")
    assert EpisodeDataset(tmp_path)[10].policy is None


def test_frame_count_mismatch_names_the_file(tmp_path):
    dataset = write_episodes(tmp_path, make_records(1))
    frames_file = tmp_path / "frames" / "episode_000010.npz"
    record = dataset[10]
    np.savez(frames_file, **{"frames": record.frames[:4], "view.wrist": record.views["wrist"][:4]})
    with pytest.raises(ValueError, match=r"episode_000010.npz\['frames'\]: 4 frames, but episodes.parquet has 6"):
        dataset[10]


def test_wrong_frame_dtype_names_the_file(tmp_path):
    dataset = write_episodes(tmp_path, make_records(1, with_view=False))
    np.savez(tmp_path / "frames" / "episode_000010.npz", frames=dataset[10].frames.astype(np.float32))
    with pytest.raises(ValueError, match=r"episode_000010.npz\['frames'\]: expected dtype uint8"):
        dataset[10]


def test_missing_frame_file_and_missing_view_key(tmp_path):
    dataset = write_episodes(tmp_path, make_records(2))
    (tmp_path / "frames" / "episode_000010.npz").unlink()
    with pytest.raises(ValueError, match="episode_000010.npz: no such file"):
        dataset[10]
    record = dataset[11]
    np.savez(tmp_path / "frames" / "episode_000011.npz", frames=record.frames, reference=record.reference)
    with pytest.raises(ValueError, match="episode_000011.npz: no array 'view.wrist'"):
        dataset[11]


def test_unreadable_mp4_names_the_file(tmp_path):
    dataset = write_episodes(tmp_path, make_records(1, with_view=False), "mp4")
    (tmp_path / "frames" / "episode_000010.mp4").write_bytes(b"not a video" * 10)
    with pytest.raises(ValueError, match="episode_000010.mp4: not a readable video"):
        dataset[10]


def make_pairs(num_pairs: int = 3) -> list[PreferencePair]:
    rng = np.random.default_rng(1)
    world = ShapesWorld(size=32)
    return [PreferencePair(pair_id, *world.preference_pair(rng)) for pair_id in range(num_pairs)]


def test_pair_round_trip(tmp_path):
    clips = np.zeros((3, 8, 8, 3), np.uint8), np.ones((3, 8, 8, 3), np.uint8)
    pairs = make_pairs() + [PreferencePair(7, "two equally good clips", *clips, tie=True)]
    dataset = write_pairs(tmp_path / "prefs", pairs)

    assert dataset.pair_ids == [0, 1, 2, 7] and dataset.meta["num_pairs"] == 4
    for original, loaded in zip(pairs, dataset):
        assert loaded.prompt == original.prompt and loaded.tie == original.tie
        assert loaded.margin == pytest.approx(original.margin, rel=1e-6)
        np.testing.assert_array_equal(loaded.chosen, original.chosen)
        np.testing.assert_array_equal(loaded.rejected, original.rejected)
    chosen, rejected = dataset.to_requests(dataset[7])
    assert chosen.key == SampleKey("prefs", "pair_000007.chosen", 2)
    assert rejected.key == SampleKey("prefs", "pair_000007.rejected", 2)
    table = pq.read_table(tmp_path / "prefs" / "pairs.parquet")
    assert table["chosen"][0].as_py() == "items/pair_000000_chosen.npz"
    assert str(table.schema.field("margin").type) == "float"
    assert temporary_files(tmp_path) == []


def test_pair_items_may_be_png(tmp_path):
    dataset = write_pairs(tmp_path, make_pairs(1))
    image = dataset[0].chosen[0]
    Image.fromarray(image).save(tmp_path / "items" / "chosen.png")
    table = pq.read_table(tmp_path / "pairs.parquet")
    pq.write_table(table.set_column(2, "chosen", [["items/chosen.png"]]), tmp_path / "pairs.parquet")
    np.testing.assert_array_equal(PairDataset(tmp_path)[0].chosen, image[None])


def test_pair_errors(tmp_path):
    image = np.zeros((1, 4, 4, 3), np.uint8)
    with pytest.raises(ValueError, match="margin must be"):
        PreferencePair(0, "a prompt", image, image, margin=-1.0)
    with pytest.raises(ValueError, match="a tie must have margin 0"):
        PreferencePair(0, "a prompt", image, image, margin=0.5, tie=True)
    dataset = write_pairs(tmp_path, make_pairs(2))
    (tmp_path / "items" / "pair_000001_rejected.npz").unlink()
    with pytest.raises(ValueError, match="pair_000001_rejected.npz: no such file"):
        dataset[1]
    table = pq.read_table(tmp_path / "pairs.parquet")
    pq.write_table(table.drop_columns(["tie"]), tmp_path / "pairs.parquet")
    with pytest.raises(ValueError, match=r"pairs.parquet: missing column\(s\) \['tie'\]"):
        PairDataset(tmp_path)


def test_build_progress_dataset_is_deterministic(tmp_path):
    settings = dict(num_episodes=4, num_frames=5, size=24)
    first = build_progress_dataset(tmp_path / "a", seed=3, **settings)
    second = build_progress_dataset(tmp_path / "b", seed=3, **settings)
    other = build_progress_dataset(tmp_path / "c", seed=4, **settings)

    assert pq.read_table(tmp_path / "a" / "episodes.parquet").equals(pq.read_table(tmp_path / "b" / "episodes.parquet"))
    for episode_id in first.episode_ids:
        np.testing.assert_array_equal(first[episode_id].frames, second[episode_id].frames)
    assert not np.array_equal(first[0].frames, other[0].frames)
    assert first.meta["generator"]["seed"] == 3 and first.meta["name"] == "a"
    assert set(pq.read_table(tmp_path / "a" / "episodes.parquet")["policy"].to_pylist()) <= {
        "expert",
        "random",
        "wrong_object",
        "wrong_goal",
    }


def test_build_progress_dataset_rejects_unknown_policy(tmp_path):
    with pytest.raises(ValueError, match="unknown policies"):
        build_progress_dataset(tmp_path, num_episodes=1, seed=0, policy_mix={"expert": 1.0, "teleport": 1.0})


def test_build_preference_dataset_is_deterministic(tmp_path):
    first = build_preference_dataset(tmp_path / "a", num_pairs=3, seed=5, size=24)
    second = build_preference_dataset(tmp_path / "b", num_pairs=3, seed=5, size=24)
    for pair_id in first.pair_ids:
        a, b = first[pair_id], second[pair_id]
        assert a.prompt == b.prompt and a.margin == b.margin > 0
        np.testing.assert_array_equal(a.chosen, b.chosen)
        assert a.chosen.shape == (1, 24, 24, 3)
