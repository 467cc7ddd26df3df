"""XLA's compile time of bench_loo's block program, part by part: the engine's program as
it lowers it (a product computed draw-major, then transposed; a gather by group; the
normal log-density), and the same with one part changed or left out. Each variant a new
function (no cache), compiled once after a warm-up compile. Then a product of K terms,
(4000, K) x (K, rows), at "highest" precision against `_jaxpr_eval._exact_product`'s
multiplies and adds: compile and run seconds, and each one's largest error against float64.

    python benchmarks/probes/loo_compile_parts.py [--rows 5584] [--terms 3,16,64]
"""

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=5584)
    parser.add_argument("--terms", default="3,16,64")
    args = parser.parse_args()
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    n, s, groups = args.rows, 4000, 40
    f32 = jnp.float32
    specs = (
        jax.ShapeDtypeStruct((4, 1000), f32),  # sigma
        jax.ShapeDtypeStruct((4, 1000, 3), f32),  # b
        jax.ShapeDtypeStruct((4, 1000, groups), f32),  # a
        jax.ShapeDtypeStruct((n, 3), f32),  # x
        jax.ShapeDtypeStruct((n,), jnp.uint8),  # group
        jax.ShapeDtypeStruct((n,), f32),  # y
    )
    high, default = lax.Precision.HIGHEST, lax.Precision.DEFAULT

    def swapped(b, x, precision):  # the engine's: draw-major product, then transposed
        out = lax.dot_general(b[:, :, None], x, (([1], [1]), ((), ())), precision=precision)
        return jnp.transpose(out, (0, 2, 1)).reshape(s, n)

    def plain(b, x, precision):
        return jnp.dot(b, x.T, precision=precision)

    def elementwise(b, x, precision):
        return sum(b[:, k, None] * x[None, :, k] for k in range(3))

    def program(product, precision, gather=True, reshape=True):
        def run(sigma, b, a, x, group, y):
            sigma, b, a = sigma.reshape(s), b.reshape(s, 3), a.reshape(s, groups)
            mu = product(b, x, precision) if product else 0.0
            if gather:
                mu = mu + a[:, group.astype(jnp.int32)]
            z = (y[None, :] - mu) / sigma[:, None]
            lp = -0.5 * z * z - 0.9189385 - jnp.log(sigma)[:, None]
            lp = jnp.where((sigma > 0)[:, None], lp, -jnp.inf)
            return lp.reshape(4, 1000, n) if reshape else lp

        return run

    variants = {
        "engine (swapped dot, highest)": program(swapped, high),
        "swapped dot, default precision": program(swapped, default),
        "plain dot, highest": program(plain, high),
        "plain dot, default precision": program(plain, default),
        "elementwise product (exact)": program(elementwise, None),
        "no product": program(None, None),
        "no gather (swapped dot, highest)": program(swapped, high, gather=False),
        "no final reshape": program(swapped, high, reshape=False),
        "trivial x + 1": lambda sigma, b, a, x, group, y: x + 1,
    }
    jax.jit(lambda v: v * 2).lower(np.ones(3, np.float32)).compile()  # the device opened
    print(jax.devices()[0].device_kind, jax.__version__, f"rows {n}", flush=True)
    for name, fn in variants.items():
        tic = time.perf_counter()
        jax.jit(fn).lower(*specs).compile()
        print(f"{name:36s} {time.perf_counter() - tic:7.3f} s", flush=True)
    products(args, n, s)


def products(args, n: int, s: int) -> None:
    import jax
    import numpy as np
    from jax import lax

    from pymc_chunkpost._engine.kernels.jaxpr_eval import _exact_product

    numbers = (((1,), (0,)), ((), ()))
    for terms in [int(t) for t in args.terms.split(",")]:
        rng = np.random.default_rng(terms)
        b, x = rng.normal(size=(s, terms)), rng.normal(size=(terms, n))
        exact = b @ x
        forms = {
            "highest": lambda b, x: lax.dot_general(b, x, numbers, precision=lax.Precision.HIGHEST),
            "multiplies and adds": lambda b, x: _exact_product(
                b, x, {"dimension_numbers": numbers}
            ),
        }
        args32 = [jax.device_put(v.astype(np.float32)) for v in (b, x)]
        for name, fn in forms.items():
            tic = time.perf_counter()
            compiled = jax.jit(fn).lower(*args32).compile()
            compile_s = time.perf_counter() - tic
            runs = []
            for _ in range(3):
                tic = time.perf_counter()
                out = compiled(*args32).block_until_ready()
                runs.append(time.perf_counter() - tic)
            error = np.abs(np.asarray(out, dtype=float) - exact).max() / np.abs(exact).max()
            print(
                f"K={terms:3d} {name:20s} compile {compile_s:6.3f} s, run {min(runs):.5f} s, "
                f"error {error:.1e}",
                flush=True,
            )


if __name__ == "__main__":
    main()
