"""Many processes, one run: MPI for the processes and the CPU's bytes, NCCL for the GPUs'.

Above the engine (which knows nothing of other processes) and the model, below training:
`world` (which process this is, from MPI), `comm` (in-place sum collectives: MPI on the CPU,
NCCL on GPUs), `group` (joining the run, the heartbeat that turns a silent rank into an
error, aborting the job on failure), `data_parallel` (bucketed all-reduce, ZeRO-1) and
`launcher` (finding mpiexec, `rustyflow train --gpus N`).
"""
