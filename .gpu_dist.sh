set -x
nvidia-smi -L; python3 -c "import torch; print(torch.__version__, torch.cuda.device_count())"
export NCCL_NVLS_ENABLE=0
cd "$(pwd)"
mkdir -p $OUT
t0=$(date +%s.%N)
python3 -m torch.distributed.run --standalone --nproc-per-node 2 remote_scripts/dist_check.py --steps 20 --events $OUT/single.jsonl > $OUT/single.log 2>&1; echo "single rc=$?"
t1=$(date +%s.%N)
for r in 0 1; do CUDA_VISIBLE_DEVICES=$r python3 remote_scripts/node_launcher.py --node-rank $r --nnodes 2 --nproc-per-node 1 --endpoint 127.0.0.1:29511 --run-id gpu-two-nodes --node-names a,b --heartbeat 1 --peer-timeout 20 --events $OUT/node$r.jsonl -- remote_scripts/dist_check.py --steps 20 --events $OUT/node$r.jsonl > $OUT/node$r.log 2>&1 & done; wait; echo "two-node done"
t2=$(date +%s.%N)
# one node fails: rank 1 exits at step 3, node 0 must stop
for r in 0 1; do CUDA_VISIBLE_DEVICES=$r python3 remote_scripts/node_launcher.py --node-rank $r --nnodes 2 --nproc-per-node 1 --endpoint 127.0.0.1:29521 --run-id gpu-fail --node-names a,b --heartbeat 1 --peer-timeout 20 -- remote_scripts/dist_check.py --steps 200 --step-seconds 0.2 --fail-rank 1 --fail-step 3 > $OUT/fail$r.log 2>&1 & done; wait
t3=$(date +%s.%N)
echo "times single=$(echo "$t1-$t0"|bc) two_nodes=$(echo "$t2-$t1"|bc) fail=$(echo "$t3-$t2"|bc)"
grep -h "all checks passed\|process group up\|CHECK FAILED\|node_launcher" $OUT/*.log | cut -c1-250
nvidia-smi --query-compute-apps=pid,name --format=csv
