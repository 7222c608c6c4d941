/* What cupti-sys binds: CUPTI (callbacks, activity, stream ids, timestamps) and the driver
 * API parameter structs the launch callbacks carry. Input of `cargo xtask codegen`. */
#include <cupti.h>
