# Helpers that give every Largo target the same flags, precompiled header and layout.

# Flags shared by all of Largo's own targets (library layers, program, tests, benchmarks).
# They are GCC's, for the C++ sources only: nvcc takes neither the warnings nor the
# sanitizers (a layer's .cu files get largo_add_cuda_sources' instead).
function(largo_apply_flags target)
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:CXX>:${LARGO_TORCH_CXX_FLAGS};${LARGO_WARNINGS};${LARGO_SANITIZER_FLAGS}>")
  # __FILE__ relative to the checkout (GoogleTest's macros use it): a unity source #includes
  # its files by absolute path, and a clone's path in the preprocessed text would keep ccache
  # from reusing another clone's objects (scripts/build.sh sets its base directory).
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:CXX>:-fmacro-prefix-map=${PROJECT_SOURCE_DIR}/=>")
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

# A layer's .cu files (LARGO_BUILD_CUDA_KERNELS): an object library `<target>_cuda` of their
# own, whose objects go into the layer's static library. It links nothing, so nvcc sees no
# libtorch header or definition (the kernels' host side speaks to the layer's C++ through a
# header of plain types) and no include path of the build folder or the checkout: ccache keys
# its objects by the source alone, and CI's clone reuses a session's (the C++ targets'
# fmt-first folder would reach nvcc as -isystem=<build>/fmt-first, a form ccache does not make
# relative). Flags, on top of the CUDA flags Torch's CMake configuration sets (-gencode for
# TORCH_CUDA_ARCH_LIST, --expt-relaxed-constexpr ...): libtorch's ABI macro (one ABI per
# program), the host compiler's warnings, LARGO_WERROR for nvcc's own warnings too; no sanitizer
# flags (device code cannot take them; nvcc's host stubs need none), no unity batches and no
# precompiled header (both are the C++ compiler's). C++17: CMake 3.25 knows no C++20 flag for
# nvcc. The CUDA runtime is libtorch's shared one (LARGO_CUDART_LIBRARY, CMakeLists.txt).
function(largo_add_cuda_sources target cuda_sources)
  add_library(${target}_cuda OBJECT ${cuda_sources})
  set(flags ${LARGO_TORCH_CXX_FLAGS} -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter)
  if(LARGO_WERROR)
    list(APPEND flags --Werror=all-warnings)
  endif()
  target_compile_options(${target}_cuda PRIVATE ${flags})
  set_target_properties(${target}_cuda PROPERTIES CUDA_STANDARD 17 CUDA_RUNTIME_LIBRARY None)
  target_sources(${target} PRIVATE $<TARGET_OBJECTS:${target}_cuda>)
  target_compile_definitions(${target} PRIVATE LARGO_WITH_CUDA_KERNELS)
  target_link_libraries(${target} PUBLIC ${LARGO_CUDART_LIBRARY})
endfunction()

# Compiles `target`'s sources in batches (LARGO_UNITY_BUILD, see CMakeLists.txt).
function(largo_apply_unity_build target)
  if(LARGO_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON
                                               UNITY_BUILD_BATCH_SIZE ${LARGO_UNITY_BATCH_SIZE})
  endif()
endfunction()

# largo_add_layer(<name> DEPS ...): a static library `largo_<name>` built from
# src/largo/<name>/**/*.cpp (and **/*.cu when LARGO_BUILD_CUDA_KERNELS) with public headers
# in include/largo/<name>/ (a layer that holds several subsystems keeps each in a sub-folder,
# e.g. parallel/pipeline/).
# The first layer (core) owns the precompiled header; the others reuse it, so
# torch/torch.h is parsed once per build instead of once per source file.
function(largo_add_layer name)
  cmake_parse_arguments(ARG "" "" "DEPS" ${ARGN})
  file(GLOB_RECURSE sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/largo/${name}/*.cpp)
  set(cuda_sources "")
  if(LARGO_BUILD_CUDA_KERNELS)
    file(GLOB_RECURSE cuda_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/largo/${name}/*.cu)
  endif()
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
  if(cuda_sources)
    largo_add_cuda_sources(${target} "${cuda_sources}")
  endif()
  largo_apply_unity_build(${target})
  if(name STREQUAL "core")
    target_precompile_headers(${target} PRIVATE ${PROJECT_SOURCE_DIR}/include/largo/core/pch.h)
  else()
    target_precompile_headers(${target} REUSE_FROM largo_core)
  endif()
endfunction()
