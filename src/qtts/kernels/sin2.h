/* qtts kernels: the constants of sin(v)^2 shared by snake.c and snake_rows.c.
 *
 * sin^2 has period pi: v is reduced to r = v - n * pi in [-pi/2, pi/2] (n the nearest integer of
 * v / pi; pi in three parts, Cody-Waite, exact products for |n| < 2^13), then sin(r) is an odd
 * degree-13 Taylor polynomial (truncation error < 7e-10 there). Lanes with |v| >= REDUCE_LIMIT
 * take libm's sinf.
 */
#ifndef QTTS_SIN2_H
#define QTTS_SIN2_H

#define REDUCE_LIMIT 25000.0f
#define INV_PI 0.318309886183790671538f
#define PI_A 3.140625f
#define PI_B 9.67502593994140625e-4f
#define PI_C 1.509957990978376432e-7f
#define S3 -1.6666666666666667e-1f
#define S5 8.3333333333333333e-3f
#define S7 -1.9841269841269841e-4f
#define S9 2.7557319223985893e-6f
#define S11 -2.5052108385441720e-8f
#define S13 1.6059043836821615e-10f
#define ROUND_MAGIC 12582912.0f /* 1.5 * 2^23: (v + M) - M rounds to the nearest integer */

#endif
