# Registers one CTest test per GoogleTest suite of a test binary (run with cmake -P after each build of it).
#   -D TEST_EXECUTABLE=path   the GoogleTest binary
#   -D OUTPUT=path            the CTest script to write (add_test and set_tests_properties per suite)
#   -D TIMEOUT=seconds        each suite's time limit
# The suites come from the binary's own listing (--gtest_list_tests with JSON output), so test names holding any
# character are read safely. The script is written next to OUTPUT and renamed into place, so CTest never includes a
# half-written one.
foreach(var TEST_EXECUTABLE OUTPUT TIMEOUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "TrlTestSuites.cmake: -D ${var}=... is required")
  endif()
endforeach()

set(listing "${OUTPUT}.list.json")
file(REMOVE "${listing}")
execute_process(COMMAND "${TEST_EXECUTABLE}" --gtest_list_tests "--gtest_output=json:${listing}"
                OUTPUT_VARIABLE out ERROR_VARIABLE out RESULT_VARIABLE rc TIMEOUT 120)
if(NOT rc EQUAL 0 OR NOT EXISTS "${listing}")
  message(FATAL_ERROR "listing the tests of ${TEST_EXECUTABLE} failed (exit ${rc}):\n${out}")
endif()
file(READ "${listing}" json)
file(REMOVE "${listing}")

string(JSON suites LENGTH "${json}" testsuites)
set(tests 0)
set(script "# Written by cmake/TrlTestSuites.cmake from ${TEST_EXECUTABLE} --gtest_list_tests: one test per suite.\n")
if(suites GREATER 0)
  math(EXPR last "${suites} - 1")
  foreach(i RANGE ${last})
    string(JSON suite GET "${json}" testsuites ${i} name)
    string(JSON count GET "${json}" testsuites ${i} tests)
    math(EXPR tests "${tests} + ${count}")
    string(APPEND script
      "add_test([==[${suite}]==] [==[${TEST_EXECUTABLE}]==] [==[--gtest_filter=${suite}.*]==])\n"
      "set_tests_properties([==[${suite}]==] PROPERTIES TIMEOUT ${TIMEOUT})\n")
  endforeach()
endif()
file(WRITE "${OUTPUT}.tmp" "${script}")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
message(STATUS "${TEST_EXECUTABLE}: ${tests} tests in ${suites} suites, one CTest test per suite")
