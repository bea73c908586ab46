// One job over several processes, on one machine or many, through MPI (Open MPI):
// `mpirun -np N kivi generate ... --dist tp` starts N copies of the command, and this
// module connects them.
//
// Every rank runs the same command on the same input: rank 0 reads standard input and
// sends what it read to the others (broadcast), every rank computes its share of each
// step, and the collectives leave the same logits on every rank, so that every rank
// samples the same token. Rank 0 alone prints and writes files.
//
// Without MPI in the build, or without mpirun, there is one process and every function
// here is the identity.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.h"

namespace kivi::model {
class TpComm;
class CpComm;
}  // namespace kivi::model
namespace kivi::runtime {
class StepLink;
}  // namespace kivi::runtime

namespace kivi::dist {

// How the ranks share the work (--dist): tp ranks split each layer (tensor parallelism,
// model/tensor_parallel.h), cp groups of them split the context's positions (context
// parallelism, model/context_parallel.h). tp * cp == the number of ranks.
struct Layout {
  int tp = 1, cp = 1;
};
// "tp" (every rank), "tp=N", "cp", "cp=N", "tp=A,cp=B"; throws kivi::Error naming the
// problem (a count that does not multiply to `world`, an unknown word).
Layout parse_layout(const std::string& s, int world);
std::string layout_name(const Layout& l);

// True when this build has MPI.
bool built_with_mpi();
// Starts MPI when the process was launched by mpirun (its environment says so); else
// nothing. Call first thing in main.
void init(int* argc, char*** argv);
// Ends MPI (every rank must call it) when init started it.
void finalize();
int rank();
int size();  // 1 without mpirun
bool is_root();

// Ranks other than 0 print nothing from here on: stdout and stderr go to /dev/null, and
// report_error() writes to the stderr the process started with.
void silence_other_ranks();

// An error every rank meets at the same point (a check after a collective): each rank
// exits 1 and rank 0 alone prints it.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

// Every rank passes its own result of a step ("" when it went well). When any rank
// failed, every rank throws CollectiveError with the message of the lowest failing rank
// ("rank R: ..." when that is not rank 0).
void agree(const std::string& error);
// Throws CollectiveError on every rank when the ranks hold different values of `value`
// (a fingerprint), naming `what` and the first rank that differs.
void check_same(uint64_t value, const char* what);

// Rank 0's value on every rank.
void broadcast(std::string& s);
void broadcast(uint64_t& v);

// Sets up the groups of `layout` over every rank (collective). Throws
// CollectiveError when the layout does not fit the rank count.
void setup(const Layout& layout);
// This process's tensor-parallel group, or null without one (tp == 1).
model::TpComm* tp_comm();
// This process's context-parallel group, or null without one (cp == 1).
model::CpComm* cp_comm();
// The link over which rank 0's serving scheduler sends its steps to the other ranks
// (runtime/step_link.h); collective on the first call. Null in one process.
runtime::StepLink* step_link();

// Prints an error as the command's last word and ends the process with `code`: rank 0
// prints, other ranks print (with their rank) only what rank 0 cannot know; an error
// that is not collective ends the whole job (MPI_Abort), so no rank waits forever.
[[noreturn]] void exit_on_error(const char* message, bool collective, int code);

}  // namespace kivi::dist
