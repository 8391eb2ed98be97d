/* A client's SGD step over all of its float32 parameters in one pass (fedaug.core.local_sgd).
 *
 * For each element, the arithmetic of torch.optim.SGD's single-tensor step on the CPU (dampening 0,
 * no Nesterov), with its roundings in its order:
 *
 *   d = fma(p, wd, g)                    grad.add(param, alpha=weight_decay)  (skipped when wd == 0)
 *   b = d               (first step)     torch.clone(grad)
 *   b = (b * m) + d     (later steps)    buf.mul_(momentum).add_(grad)        (skipped when m == 0: b = d)
 *   p = fma(b, -lr, p)                   param.add_(buf, alpha=-lr)
 *
 * ATen computes `a + alpha * b` with one fused multiply-add in its vectorised kernels; this file is
 * compiled with -ffp-contract=off, so the only fused operations are the explicit fmaf calls and the
 * momentum's product and sum are rounded apart, as ATen rounds them. Whether that holds on a given
 * CPU and torch build is not assumed: fedaug.core.local_sgd compares this step with torch's on a
 * probe before it uses the library. Elements are independent, so any split over threads gives the
 * same bits.
 */
#include <math.h>
#include <stdint.h>

#define PER_THREAD 65536 /* values a thread takes at least, so that small tensors stay on one thread */

static void step_one(float *p, const float *g, float *b, int64_t n, float lr, float wd, float m, int first,
                     int threads) {
    const int decay = wd != 0.0f, momentum = m != 0.0f;
    int nt = (int)(n / PER_THREAD);
    nt = nt < 1 ? 1 : (nt > threads ? threads : nt);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t i = 0; i < n; ++i) {
        float d = decay ? fmaf(p[i], wd, g[i]) : g[i];
        if (momentum) {
            if (!first) {
                float t = b[i] * m;
                d = t + d;
            }
            b[i] = d;
        }
        p[i] = fmaf(d, -lr, p[i]);
    }
}

/* One step over `count` tensors: params[k], grads[k] and bufs[k] hold sizes[k] contiguous floats;
 * first[k] != 0 where tensor k has no momentum buffer yet (its buffer is written, not read). */
void fedaug_sgd_step(int64_t count, float *const *params, const float *const *grads, float *const *bufs,
                     const int64_t *sizes, const int32_t *first, float lr, float wd, float m, int32_t threads) {
    for (int64_t k = 0; k < count; ++k)
        step_one(params[k], grads[k], bufs[k], sizes[k], lr, wd, m, first[k], threads);
}
