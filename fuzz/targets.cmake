# The libFuzzer targets (TRL_FUZZ, included by the top-level CMakeLists.txt): one executable per parser of outside
# input, each linking the library as the program does, built with the sanitizers of this configuration and
# libFuzzer's coverage of the readers (CMakeLists.txt, TRL_PARSER_SOURCES). fuzz/run.sh builds and runs them; scripts/test.sh runs each briefly from the sanitizer build.
foreach(name parquet safetensors config tokenizer jinja dataset yaml checkpoint serve)
  set(extra)
  if(name STREQUAL "yaml")
    set(extra ${PROJECT_SOURCE_DIR}/src/cli/train_options.cpp)  # the training options (in the trl executable, not the library)
  endif()
  add_executable(${name}_fuzz ${PROJECT_SOURCE_DIR}/fuzz/${name}_fuzz.cpp ${extra})
  target_include_directories(${name}_fuzz PRIVATE ${PROJECT_SOURCE_DIR}/fuzz ${TRL_INTERNAL_INCLUDES})
  target_compile_options(${name}_fuzz PRIVATE ${TRL_WARNINGS} -fsanitize=fuzzer-no-link)
  target_link_options(${name}_fuzz PRIVATE -fsanitize=fuzzer)
  target_link_libraries(${name}_fuzz PRIVATE trl_lib)
endforeach()
target_link_libraries(dataset_fuzz PRIVATE PkgConfig::ZLIB)  # it gzips rows into .jsonl.gz files
target_link_libraries(serve_fuzz PRIVATE trl_cli)  # the server's request reader (src/serve/openai.cpp)
