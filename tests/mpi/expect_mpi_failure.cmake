# Runs a program under mpirun (cmake -P, from ctest) and checks that the job FAILED the way it should:
# mpirun ends by itself within TIMEOUT seconds (no rank left hanging), exits non-zero, and its output
# (stdout and stderr together) matches every regex EXPECT_1 .. EXPECT_4 that is given and never FORBID.
# Variables (-D): MPIEXEC, NUMPROC_FLAG, NP, FLAGS (mpirun flags joined with "|": a ";" would split the
# argument on its way here), PROGRAM, ARGS (optional, "|"-joined), TIMEOUT (seconds), EXPECT_1..4, FORBID.
foreach(var MPIEXEC NUMPROC_FLAG NP FLAGS PROGRAM TIMEOUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "expect_mpi_failure.cmake: -D${var}=... missing")
  endif()
endforeach()
string(REPLACE "|" ";" flags "${FLAGS}")
string(REPLACE "|" ";" args "${ARGS}")

string(TIMESTAMP start "%s")
execute_process(
  COMMAND ${MPIEXEC} ${NUMPROC_FLAG} ${NP} ${flags} ${PROGRAM} ${args}
  RESULT_VARIABLE rc
  OUTPUT_VARIABLE out
  ERROR_VARIABLE err
  TIMEOUT ${TIMEOUT})
string(TIMESTAMP end "%s")
math(EXPR seconds "${end} - ${start}")
message("mpirun exit: ${rc} after ${seconds} s\n--- stdout\n${out}--- stderr\n${err}---")

if(NOT rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "FAIL: the job did not end by itself (${rc}): ranks were left hanging")
endif()
if(rc EQUAL 0)
  message(FATAL_ERROR "FAIL: mpirun exited 0; this job must fail")
endif()
foreach(i 1 2 3 4)
  if(DEFINED EXPECT_${i} AND NOT "${out}${err}" MATCHES "${EXPECT_${i}}")
    message(FATAL_ERROR "FAIL: the output does not match EXPECT_${i}: ${EXPECT_${i}}")
  endif()
endforeach()
if(DEFINED FORBID AND "${out}${err}" MATCHES "${FORBID}")
  message(FATAL_ERROR "FAIL: the output matches FORBID: ${FORBID}")
endif()
message("PASS: the job failed as expected (exit ${rc}, ${seconds} s)")
