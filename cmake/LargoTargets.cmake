# Helpers that give every Largo target the same flags, precompiled header and layout.

# Flags shared by all of Largo's own targets (library layers, program, tests, benchmarks).
function(largo_apply_flags target)
  target_compile_options(${target} PRIVATE ${LARGO_TORCH_CXX_FLAGS} ${LARGO_WARNINGS} ${LARGO_SANITIZER_FLAGS})
  # __FILE__ relative to the checkout (GoogleTest's macros use it): a unity source #includes
  # its files by absolute path, and a clone's path in the preprocessed text would keep ccache
  # from reusing another clone's objects (scripts/build.sh sets its base directory).
  target_compile_options(${target} PRIVATE -fmacro-prefix-map=${PROJECT_SOURCE_DIR}/=)
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "EXECUTABLE")
    # Compile executables with -fPIC like the libraries (not -fPIE), so they can
    # reuse the libraries' precompiled header, which GCC only accepts with equal flags.
    set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
    target_compile_options(${target} PRIVATE -fPIC)
  endif()
  if(LARGO_SANITIZER_FLAGS)
    target_link_options(${target} PRIVATE ${LARGO_SANITIZER_FLAGS})
  endif()
endfunction()

# Compiles `target`'s sources in batches (LARGO_UNITY_BUILD, see CMakeLists.txt).
function(largo_apply_unity_build target)
  if(LARGO_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON
                                               UNITY_BUILD_BATCH_SIZE ${LARGO_UNITY_BATCH_SIZE})
  endif()
endfunction()

# largo_add_layer(<name> DEPS ...): a static library `largo_<name>` built from
# src/largo/<name>/**/*.cpp with public headers in include/largo/<name>/ (a layer that holds
# several subsystems keeps each in a sub-folder, e.g. parallel/pipeline/).
# The first layer (core) owns the precompiled header; the others reuse it, so
# torch/torch.h is parsed once per build instead of once per source file.
function(largo_add_layer name)
  cmake_parse_arguments(ARG "" "" "DEPS" ${ARGN})
  file(GLOB_RECURSE sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/largo/${name}/*.cpp)
  set(target largo_${name})
  if(NOT sources AND NOT name STREQUAL "core")
    # A layer with no sources yet is a header-only interface (keeps the graph valid).
    add_library(${target} INTERFACE)
    add_library(largo::${name} ALIAS ${target})
    target_include_directories(${target} INTERFACE
      $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:include>)
    target_link_libraries(${target} INTERFACE ${ARG_DEPS})
    return()
  endif()
  add_library(${target} STATIC ${sources})
  add_library(largo::${name} ALIAS ${target})
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:include>)
  target_link_libraries(${target} PUBLIC ${ARG_DEPS})
  if(name STREQUAL "core")
    target_link_options(${target} PUBLIC ${LARGO_LIBSTDCXX_FIRST})
    target_include_directories(${target} SYSTEM BEFORE PUBLIC
      $<BUILD_INTERFACE:${LARGO_FMT_FIRST_DIR}> $<INSTALL_INTERFACE:include/largo-fmt-first>)
  endif()
  largo_apply_flags(${target})
  largo_apply_unity_build(${target})
  if(name STREQUAL "core")
    target_precompile_headers(${target} PRIVATE ${PROJECT_SOURCE_DIR}/include/largo/core/pch.h)
  else()
    target_precompile_headers(${target} REUSE_FROM largo_core)
  endif()
endfunction()
