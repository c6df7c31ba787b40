// Force-included (-include) when building faiss-node 0.5.1 against Debian 12's
// libfaiss-dev 1.7.3. faiss-node targets faiss 1.7.4, where idx_t lives at
// namespace scope (faiss::idx_t); in 1.7.3 it is only faiss::Index::idx_t.
#pragma once
#include <faiss/Index.h>

namespace faiss {
using idx_t = Index::idx_t;
}
