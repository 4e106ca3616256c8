//! Cache maintenance for a decode step (DESIGN.md section 2.5): each sequence's new
//! token's K and V appended to the paged cache, its K quantized into dusk's quantized copy,
//! and the selectors' state of the pages it lands in updated, in one launch.
//!
//! - [`append`]: [`AppendPlan`], the plan (validated once; `run` allocates nothing and
//!   never syncs), with [`AppendParts`] (what is written beside the cache) and
//!   [`AppendTargets`] (where).
//! - [`append_kernel`]: the kernel, which calls the parts in sequence.
//! - [`parts`]: one kernel-language helper per piece of state a token updates (the cache,
//!   the quantized copy, Quest's min and max).
//! - [`token`]: where each new token goes, from the page table on the device.
//! - [`mod@reference`]: the append on the host.
//! - [`check`]: a decode loop of appends checked against the host and the whole-cache
//!   kernels; [`mod@bench`]: the append at a benchmark shape, timed.
//!
//! README.md in this folder has the layout and how a selector's state joins the append.

pub mod append;
pub mod append_kernel;
pub mod bench;
pub mod check;
pub mod parts;
pub mod reference;
pub mod token;

pub use append::{AppendConfig, AppendParts, AppendPlan, AppendTargets};
