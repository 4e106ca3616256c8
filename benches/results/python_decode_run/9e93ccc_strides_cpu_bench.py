# The CPU figures of NOTES "A torch tensor's strides from its shape": dusk.data_ptr of a CPU
# torch tensor against torch's own reads, run with each wheel installed in turn:
#   python3 benches/results/python_decode_run/9e93ccc_strides_cpu_bench.py
import time, statistics, torch, dusk
q = torch.zeros(32, 32, 128, dtype=torch.float16)
def t(fn, n=20000):
    best=[]
    for _ in range(7):
        t0=time.perf_counter()
        for _ in range(n): fn()
        best.append((time.perf_counter()-t0)/n*1e6)
    return statistics.median(best)
print("dusk.data_ptr(q): %.3f us" % t(lambda: dusk.data_ptr(q)))
def own():
    q.dtype; q.is_cuda; q.get_device(); q.shape; q.stride(); q.data_ptr()
print("torch own reads: %.3f us" % t(own))
print("q.get_device(): %.3f us" % t(lambda: q.get_device()))
print("q.is_cuda: %.3f us" % t(lambda: q.is_cuda))
print("q.shape: %.3f us" % t(lambda: q.shape))
print("q.stride(): %.3f us" % t(lambda: q.stride()))
print("q.data_ptr(): %.3f us" % t(lambda: q.data_ptr()))
print("q.dtype: %.3f us" % t(lambda: q.dtype))
print("q.device: %.3f us" % t(lambda: q.device))
print("noop: %.3f us" % t(lambda: None))
print("q.is_contiguous(): %.3f us" % t(lambda: q.is_contiguous()))
print("q.size(): %.3f us" % t(lambda: q.size()))
print("q.ndim: %.3f us" % t(lambda: q.ndim))
print("q.element_size(): %.3f us" % t(lambda: q.element_size()))
