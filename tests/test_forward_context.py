from kernels_reference.forward_context import AttentionMetadata


def test_state_slots_and_which_sequences_continue_a_state():
    meta = AttentionMetadata.build([0, 5, 3], [4, 1, 1], 16, state_slots=[2, 0, 5])
    assert meta.state_slots.tolist() == [2, 0, 5]
    assert meta.has_initial_state.tolist() == [False, True, True]  # a fresh prompt starts from zero
    assert AttentionMetadata.build([7], [3], 16).state_slots is None  # attention-only steps have none
