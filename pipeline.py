"""Pipeline: the ring of shared-memory slots between a producer and its consumers, as one object.

v3 wrote the ring out inline in every kernel: two barrier arrays, a stage index and a phase
per side, and the rule that flips the phase when the stage wraps. From v4 on that
bookkeeping lives here, and a kernel says only what each side does:

    producer                                  consumer
    pipe.producer_acquire(bytes)              pipe.consumer_acquire()
    TMA loads into slot producer_stage,       multiply slot consumer_stage
      completing on pipe.producer_barrier()   free a slot: pipe.consumer_release_*()
    pipe.producer_advance()                   pipe.consumer_advance()

The contract (who arrives on which barrier, how many times, and the phases):

- ``full_barriers[s]``, "slot s holds data": arrival count 1. The producer's one thread
  arrives with ``arrive_and_expect_tx(bytes)`` and the TMA engine completes the phase as the
  bytes land. The consumer waits on it.
- ``empty_barriers[s]``, "slot s may be overwritten": arrival count ``consumer_arrivals``,
  chosen by the kernel for the way its consumers release a slot. The producer waits on it.
  - Hopper: the slot is free once ``wgmma.wait_group`` proves the MMA that read it finished.
    A wgmma is one operation of the whole warpgroup, so one arrival per consumer warpgroup
    would do. v4 to v6 have every consumer thread arrive (``consumer_release_previous``,
    count 128 per warpgroup): no branch in the MMA loop, which ptxas would answer by
    serialising the wgmmas. From v7 on one thread per warpgroup arrives on the barrier of
    each CTA of its cluster (``consumer_release_previous_in_cluster``): count warpgroups x CTAs.
  - Blackwell: ``tcgen05.commit`` makes the tensor core itself arrive, once, when every MMA
    issued so far has finished (``consumer_release_async``): count 1.
- Phases: every barrier starts in phase 0 and a wait for phase p passes once phase p has
  completed. The consumer starts at phase 0 (``consumer_initial_phase``): its first wait
  blocks until the first load lands. The producer starts at phase 1
  (``producer_initial_phase``): to a waiter, "phase 1" completed before the barrier began,
  so the first trip round the ring passes at once and every slot starts empty. Each side
  flips its phase when its stage index wraps to 0.
- Release order: a consumer frees slots in the order it acquired them, but not always at
  once: the Hopper consumer keeps one wgmma in flight, so it frees the slot of the
  previous step: the slot before ``consumer_stage`` (``previous_empty_barrier``), the oldest
  one it still holds. Arrivals need no phase, only the slot.

The state lives in registers of whichever threads use it: the producer's threads only
touch the producer fields, the consumers' only the consumer fields. Slots themselves (the
A and B tiles) stay in the kernel, indexed by ``producer_stage`` or ``consumer_stage``.
"""

import tilus
from tilus import RegisterTensor, int32, uint32


class Pipeline(tilus.Class):
    def __init__(self, stages: int, consumer_arrivals: int):
        self.stages: int = stages
        self.full_barriers = self.mbarrier.alloc(counts=[1] * stages)
        self.empty_barriers = self.mbarrier.alloc(counts=[consumer_arrivals] * stages)
        self.producer_stage: int32 = 0
        self.producer_phase: uint32 = self.mbarrier.producer_initial_phase
        self.consumer_stage: int32 = 0
        self.consumer_phase: uint32 = self.mbarrier.consumer_initial_phase

    def producer_start(self):
        """Set the producer's cursor to slot 0, phase 1, where its loop begins (see the module docstring)."""
        self.producer_stage = 0
        self.producer_phase = self.mbarrier.producer_initial_phase

    def producer_start_trips(self):
        """Before a run of whole trips round the ring (a persistent kernel's tile): the slot is 0 again.

        The phase carries on. Saying that the slot is 0 lets the compiler fold every slot
        index of a loop unrolled ``stages`` times into a constant, as ``producer_start`` does.
        """
        self.producer_stage = 0

    def producer_acquire(self, transaction_bytes: int):
        """Wait until slot producer_stage is empty, then announce the bytes its loads will bring."""
        self.mbarrier.wait(self.empty_barriers[self.producer_stage], phase=self.producer_phase)
        with self.single_thread():
            self.mbarrier.arrive_and_expect_tx(self.full_barriers[self.producer_stage], transaction_bytes)

    def producer_wait(self):
        """Wait until slot producer_stage is empty, announcing nothing: for a producer whose arrival on the full
        barrier is a ``tcgen05.commit`` (``producer_commit_async``), not a TMA load's bytes."""
        self.mbarrier.wait(self.empty_barriers[self.producer_stage], phase=self.producer_phase)

    def producer_commit_async(self):
        """Slot producer_stage is full once the tensor core has finished every MMA issued so far (Blackwell v11's
        TMEM ring)."""
        self.tcgen05.commit(mbarrier=self.full_barriers[self.producer_stage])

    def producer_barrier(self) -> RegisterTensor:
        """The barrier the TMA loads into slot producer_stage complete on."""
        return self.full_barriers[self.producer_stage]

    def producer_advance(self):
        self.producer_stage = (self.producer_stage + 1) % self.stages
        self.producer_phase = self.producer_phase ^ (self.producer_stage == 0)

    def consumer_start(self):
        """Set a consumer's cursor to slot 0, phase 0, where its loop begins (see the module docstring)."""
        self.consumer_stage = 0
        self.consumer_phase = self.mbarrier.consumer_initial_phase

    def consumer_start_trips(self):
        """The consumer's ``producer_start_trips``: slot 0 again, the phase carries on."""
        self.consumer_stage = 0

    def consumer_acquire(self):
        """Wait until slot consumer_stage is full."""
        self.mbarrier.wait(self.full_barriers[self.consumer_stage], phase=self.consumer_phase)

    def consumer_advance(self):
        self.consumer_stage = (self.consumer_stage + 1) % self.stages
        self.consumer_phase = self.consumer_phase ^ (self.consumer_stage == 0)

    def previous_empty_barrier(self) -> RegisterTensor:
        """The empty barrier of the slot before consumer_stage: the one a Hopper consumer frees next."""
        return self.empty_barriers[(self.consumer_stage + (self.stages - 1)) % self.stages]

    def consumer_release_previous(self):
        """Free the slot before consumer_stage: every calling thread arrives on its empty barrier.

        One arrival per warpgroup would be enough (docs/v3.md, when a slot is free), but it
        takes a branch to one thread inside the MMA loop, and in v4's loop that branch makes
        ptxas serialise the wgmmas (C7515). Every thread arriving needs no branch (empty count:
        the consumers' threads), as in CUTLASS's pipeline for a cluster of one CTA.
        """
        self.mbarrier.arrive(self.previous_empty_barrier())

    def consumer_release_previous_in_cluster(self, ctas: int, rank: int32):
        """Free the slot before consumer_stage in each of the cluster's ctas CTAs (1, 2 or 4).

        One thread of the calling warpgroup arrives once on each CTA's empty barrier: after
        ``wait_group`` the whole warpgroup's wgmma has finished reading the slot (docs/v3.md,
        when a slot is free). In a cluster each peer's producer multicasts into this CTA's
        slot too, so it must hear from these consumers as well (empty count: warpgroups x
        ctas); ``rank`` is this CTA's rank in the cluster.
        """
        barrier = self.previous_empty_barrier()
        with self.single_thread():
            self.mbarrier.arrive(barrier)
            if ctas == 2:
                # release at CTA scope, as for the local arrive: a cluster-scope release stalls the
                # thread until its earlier writes are visible cluster-wide, once per K step
                self.mbarrier.arrive_and_expect_tx_remote(barrier, 0, target_rank=1 - rank, scope="cta")
            elif ctas == 4:  # the three peers: rank ^ 1, rank ^ 2, rank ^ 3
                self.mbarrier.arrive_and_expect_tx_remote(barrier, 0, target_rank=rank ^ 1, scope="cta")
                self.mbarrier.arrive_and_expect_tx_remote(barrier, 0, target_rank=rank ^ 2, scope="cta")
                self.mbarrier.arrive_and_expect_tx_remote(barrier, 0, target_rank=rank ^ 3, scope="cta")

    def consumer_release(self):
        """Free slot consumer_stage: every calling thread arrives on its empty barrier (empty count: the threads)."""
        self.mbarrier.arrive(self.empty_barriers[self.consumer_stage])

    def consumer_release_async(self):
        """Free slot consumer_stage once the tensor core has finished every MMA issued so far."""
        self.tcgen05.commit(mbarrier=self.empty_barriers[self.consumer_stage])
